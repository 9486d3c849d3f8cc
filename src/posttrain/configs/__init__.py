"""The run configuration: typed, documented, sparse. The root config (`Config`) and its
loading; each section lives in its own module of this package (`configs/trainer.py`, ...).

Invariant: a config is valid or it is not built. `load_config` reads a YAML
file that sets only what differs from the defaults, applies dotted overrides
(`trainer.lr=3e-4`), and raises ConfigError with one message that names each
bad field and what it allows. A malformed file is one ConfigError line naming
the file and the place (`parse_yaml`): bytes that are not UTF-8, nesting past
MAX_DEPTH, aliases expanding past MAX_NODES, a key given twice; `read_json` holds a
JSON file a user names (a held-out set, a registry's records) to the same rules.
Importing this package imports no torch and no part of posttrain other than `errors`
(tests/configs/test_configs_light.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError, model_validator

from posttrain.configs.base import BaseConfig
from posttrain.configs.engine import EngineConfig
from posttrain.configs.eval import EvalConfig
from posttrain.configs.model import ModelSection
from posttrain.configs.monitor import MonitorConfig
from posttrain.configs.pipeline import PipelineConfig, Runtime
from posttrain.configs.rollout import RolloutConfig
from posttrain.configs.run import RunConfig
from posttrain.configs.sandbox import SandboxSection
from posttrain.configs.section import Section, did_you_mean, fields_at
from posttrain.configs.sft import SftSection
from posttrain.configs.tasks import TasksConfig
from posttrain.configs.trainer import TrainerConfig
from posttrain.errors import ConfigError


class Config(Section):
    """Everything `posttrain train` needs."""

    model: ModelSection = ModelSection()
    base: BaseConfig = BaseConfig()
    tasks: TasksConfig = TasksConfig()
    rollout: RolloutConfig = RolloutConfig()
    trainer: TrainerConfig = TrainerConfig()
    eval: EvalConfig = EvalConfig()
    run: RunConfig = RunConfig()
    monitor: MonitorConfig = MonitorConfig()
    pipeline: PipelineConfig = PipelineConfig()
    """The rollout pipeline: stage workers, queues, scheduler, staleness, replacement."""
    runtime: Runtime = "embedded"
    """Where rollout workers run: embedded (threads and processes here) or ray (actors on a Ray cluster)."""
    sandbox: SandboxSection = SandboxSection()
    """The sandbox pool of the execute stage (backend, workers, limit caps)."""
    engine: EngineConfig = EngineConfig()
    """Inference engine: hf (in process, default) or openai (a server that takes weight updates over HTTP)."""
    sft: SftSection = SftSection()
    """Supervised fine-tuning on demonstrations (`posttrain sft`; `posttrain train` does not read it)."""

    @model_validator(mode="after")
    def _elastic_on_ray(self) -> Config:
        if self.pipeline.elastic.enabled and self.runtime != "ray":
            raise ValueError("pipeline.elastic resizes Ray actor pools: it needs runtime=ray")
        return self


MAX_DEPTH = 64
"""Deepest nesting of mappings and lists a config (or an override value) may have."""
MAX_NODES = 100_000
"""Most YAML nodes a config may expand to, aliases counted at each use (a 'billion laughs' bound)."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with three refusals, each a ConfigError naming the line: nesting deeper
    than MAX_DEPTH (before the composer's recursion could overflow), a document expanding to more
    than MAX_NODES nodes through aliases (or an alias of itself), and a key given twice in one
    mapping (PyYAML keeps the last in silence)."""

    def __init__(self, stream: str, where: str) -> None:
        super().__init__(stream)
        self.where, self.depth = where, 0

    def _error(self, mark: Any, what: str) -> ConfigError:
        return ConfigError(f"{self.where}: line {mark.line + 1}: {what}")

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise self._error(self.peek_event().start_mark, f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def compose_mapping_node(self, anchor: Any) -> Any:
        node = super().compose_mapping_node(anchor)
        seen: dict[tuple[str, str], int] = {}  # (resolved tag, text) of each scalar key -> its line
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            if (key.tag, key.value) in seen:
                first = seen[(key.tag, key.value)]
                raise self._error(key.start_mark, f"duplicate key {key.value!r} (first at line {first})")
            seen[(key.tag, key.value)] = key.start_mark.line + 1
        return node

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            self._bound(node)
        return node

    def _bound(self, root: Any) -> None:
        """Count the nodes of the document as if every alias were expanded, with a cache per
        node (so a shared subtree costs one visit) and a refusal of cycles."""
        sizes: dict[int, int] = {}
        open_: set[int] = set()

        def size(node: Any, depth: int) -> int:
            key = id(node)
            if key in sizes:
                return sizes[key]
            if key in open_:
                raise self._error(node.start_mark, "an alias refers to the node that contains it")
            if depth > MAX_DEPTH:
                raise self._error(node.start_mark, f"nested deeper than {MAX_DEPTH} levels (aliases expanded)")
            open_.add(key)
            children = node.value if isinstance(node.value, list) else []
            parts = [c for pair in children for c in (pair if isinstance(pair, tuple) else (pair,))]
            total = 1 + sum(size(c, depth + 1) for c in parts)
            open_.discard(key)
            if total > MAX_NODES:
                raise self._error(node.start_mark, f"expands to more than {MAX_NODES} values (aliases counted)")
            sizes[key] = total
            return total

        size(root, 1)


def _load(text: str, where: str) -> Any:
    loader = _Loader(text, where)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_yaml(text: str, where: str) -> Any:
    """`text` as YAML (safe types only) under `_Loader`'s bounds; errors are one-line ConfigErrors
    naming `where` and the line."""
    try:
        return _load(text, where)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError(f"{where}: {at}malformed YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: malformed YAML: {' '.join(str(exc).split())}") from None


def _parse_scalar(text: str, where: str = "override") -> Any:
    """An override's value as YAML under the loader's bounds; text that is not YAML stays text."""
    try:
        return _load(text, where)
    except yaml.YAMLError:
        return text


def apply_override(tree: dict[str, Any], dotted: str) -> None:
    """Set `a.b.c=value` in a nested dict (value parsed as YAML)."""
    if "=" not in dotted:
        raise ConfigError(f"override {dotted!r} must look like section.field=value")
    key, _, raw = dotted.partition("=")
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override {dotted!r} has an empty field name")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = _parse_scalar(raw, f"override {key.strip()}")


def _describe(err: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown field"
    return f"{loc}: {err['msg']} (got {err.get('input')!r})"


def _allowed_fields(model: type[BaseModel], loc: tuple) -> str:
    names = fields_at(model, loc)
    return did_you_mean(str(loc[-1]), names) + f"; allowed: {', '.join(names)}" if names else ""


def validate(tree: dict[str, Any], source: str = "config") -> Config:
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            hint = _allowed_fields(Config, err["loc"]) if err["type"] == "extra_forbidden" else ""
            lines.append(_describe(err) + hint)
        raise ConfigError(f"{source}: " + "; ".join(lines)) from None


def _read_text(p: Path) -> str:
    """The file's text (a UTF-8 BOM dropped), or one ConfigError naming the byte and line that is not UTF-8."""
    raw = p.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{p}: not valid UTF-8 at byte {exc.start} (line {line})") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    text = _read_text(p)
    data = parse_yaml(text, str(p))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping of sections, got {type(data).__name__}")
    return data


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*+"?|[\[\]{}]', re.DOTALL)
"""A string literal (possessive, so an unterminated one costs one pass) or a bracket."""


def nests_deeper(text: str, limit: int) -> bool:
    """Whether the JSON text `text` nests arrays and objects deeper than `limit` (brackets inside
    string literals do not count), in one linear pass that stops at `limit + 1`; a text with no
    more opening brackets than `limit` is answered without a scan. The one depth check before
    `json.loads` of what a user or a model wrote (`read_json`, task-file rows, model output)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        tok = m.group()
        if tok in ("[", "{"):
            depth += 1
            if depth > limit:
                return True
        elif tok in ("]", "}"):
            depth -= 1
    return False


def _duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def read_json(path: str | Path) -> Any:
    """The JSON file at `path`, or one ConfigError line naming it and why: bytes that are not
    UTF-8, nesting deeper than MAX_DEPTH (refused before parsing), a key given twice in one
    object, NaN or Infinity, malformed JSON (line and column)."""
    p = Path(path)
    text = _read_text(p)
    if nests_deeper(text, MAX_DEPTH):
        raise ConfigError(f"{p}: nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text, object_pairs_hook=_duplicate_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: line {exc.lineno}, column {exc.colno}: malformed JSON: {exc.msg}") from None
    except ValueError as exc:
        raise ConfigError(f"{p}: {exc}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    tree = read_yaml(path) if path else {}
    for item in overrides:
        apply_override(tree, item)
    return validate(tree, str(path or "config"))


def split_cli_args(config: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """A command line's optional config file and its dotted overrides: a first
    positional argument that contains '=' is an override, not a file."""
    if config and "=" in config:
        return None, [config, *overrides]
    return config, list(overrides)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
