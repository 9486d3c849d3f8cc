"""The tool loop: the model calls declared tools with JSON; results come back as observations.

Invariant: every action is exactly one of: a valid call of a declared tool
(its arguments match the schema; the tool's result is the observation), the
final answer (a call of the `answer` tool, which ends the episode), or a
protocol violation (malformed JSON, an unknown tool, missing, extra or
mistyped arguments), which is an observation naming what was wrong and is
counted; a violation never raises and never ends the episode by itself.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from posttrain.types import Task

_TYPES: Mapping[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolSpec:
    """A declared tool: name, description and JSON-schema-like parameters
    (name -> one of string, integer, number, boolean, array, object)."""

    name: str
    description: str
    parameters: Mapping[str, str] = field(default_factory=dict)
    required: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.parameters.items() if v not in _TYPES}
        if bad:
            raise ValueError(f"ToolSpec {self.name}: parameter types must be among {sorted(_TYPES)}, got {bad}")
        missing = set(self.required) - set(self.parameters)
        if missing:
            raise ValueError(f"ToolSpec {self.name}: required names undeclared parameters {sorted(missing)}")

    def schema(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "parameters": {"type": "object", "properties": {k: {"type": v} for k, v in self.parameters.items()},
                               "required": list(self.required)}}

    def check(self, args: Any) -> str | None:
        """None when `args` fit the schema, else what is wrong."""
        if not isinstance(args, dict):
            return f"arguments of {self.name} must be a JSON object"
        missing = [k for k in self.required if k not in args]
        extra = [k for k in args if k not in self.parameters]
        if missing or extra:
            return f"{self.name}: " + "; ".join(
                x for x in (missing and f"missing {missing}", extra and f"unknown {extra}") if x
            )
        for k, v in args.items():
            want = _TYPES[self.parameters[k]]
            if not isinstance(v, want) or (isinstance(v, bool) and bool not in want):
                return f"{self.name}: argument {k!r} must be {self.parameters[k]}, got {type(v).__name__}"
        return None


@dataclass(frozen=True)
class ToolOutcome:
    """What the verifier sees: calls made, violations, the answer (None if never given)."""

    calls: int
    violations: tuple[str, ...]
    answer: Any = None

    @property
    def compliance(self) -> float:
        """Share of actions that followed the protocol."""
        return 1.0 - len(self.violations) / self.calls if self.calls else 0.0


ANSWER = ToolSpec("answer", "Give the final answer and end the episode.", {"value": "string"}, ("value",))


def parse_call(action: str) -> tuple[str, Any] | str:
    """(tool name, arguments) from `{"tool": ..., "arguments": {...}}`, optionally
    inside <tool_call>...</tool_call>; else the reason it is malformed."""
    found = _CALL.findall(action)
    text = (found[-1] if found else action).strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"malformed tool call: not JSON ({exc.msg})"
    if not isinstance(obj, dict) or not isinstance(obj.get("tool"), str):
        return 'malformed tool call: expected {"tool": name, "arguments": {...}}'
    return obj["tool"], obj.get("arguments", {})


class ToolEnv:
    """One tool-use episode over `tools` (spec and function) plus the `answer` tool."""

    def __init__(self, tools: Mapping[str, tuple[ToolSpec, Callable[..., Any]]]) -> None:
        for name, (spec, _) in tools.items():
            if spec.name != name or name == ANSWER.name:
                raise ValueError(f"ToolEnv: tool key {name!r} must equal its spec's name and not be 'answer'")
        self.tools = dict(tools)
        self._calls = 0
        self._violations: list[str] = []
        self._answer: Any = None

    def schemas(self) -> list[dict[str, Any]]:
        return [s.schema() for s, _ in self.tools.values()] + [ANSWER.schema()]

    def reset(self, task: Task) -> str:
        self._calls, self._violations, self._answer = 0, [], None
        return 'Tools (call one per turn as JSON {"tool": name, "arguments": {...}}):\n' + json.dumps(self.schemas())

    def _violation(self, why: str) -> tuple[str, bool]:
        self._violations.append(why)
        return f"protocol error: {why}", False

    def step(self, action: str) -> tuple[str, bool]:
        self._calls += 1
        parsed = parse_call(action)
        if isinstance(parsed, str):
            return self._violation(parsed)
        name, args = parsed
        spec = ANSWER if name == ANSWER.name else self.tools.get(name, (None,))[0]
        if spec is None:
            return self._violation(f"unknown tool {name!r}; declared: {sorted([*self.tools, ANSWER.name])}")
        wrong = spec.check(args)
        if wrong:
            return self._violation(wrong)
        if name == ANSWER.name:
            self._answer = args["value"]
            return "answer recorded", True
        try:
            return str(self.tools[name][1](**args)), False
        except (KeyError, ValueError, LookupError) as exc:  # the world's own refusal: an observation
            return f"tool error: {exc}", False

    def outcome(self) -> ToolOutcome:
        return ToolOutcome(self._calls, tuple(self._violations), self._answer)
