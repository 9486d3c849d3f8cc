"""Full-chain attribution of one rollout: prompt to reward to the train step that used it.

Invariant: `explain` only reads the trace store (through TraceStore); it
shows every stored field of the chain (prompt, sampling parameters,
completion, each turn of a multi-turn episode with its action or program,
observation, execution result and reward parts, the execution result,
verifier name and version, reward parts, the train step with advantage,
ratio and clip share), and says why a rollout was not trained on when it
was not (masked infra error, or a group whose rewards were all equal).
"""

from __future__ import annotations

import json
import time
from typing import Any

from posttrain.errors import ConfigError


def _block(title: str, text: str) -> list[str]:
    body = text if text else "(empty)"
    return [f"-- {title}", *("   " + line for line in body.splitlines() or [""]), ""]


def _training(row: dict[str, Any], siblings: list[dict[str, Any]]) -> list[str]:
    if row["train_step"] is not None:
        lines = [f"   used by train step {row['train_step']}", f"   advantage {row['advantage']:+.4f}"]
        if row["ratio"] is None:
            return lines + ["   ratio     - (it entered no loss: no loss tokens, or its group had no signal)"]
        clipped = row["clipped"] or 0.0
        return lines + [
            f"   ratio     {row['ratio']:.4f} (mean over its tokens, current / behaviour policy)",
            f"   clipped   {'yes' if clipped > 0 else 'no'} ({clipped:.0%} of its tokens had their gradient clipped)",
        ]
    if row["reward"] is None:
        return ["   not trained on: infra error, masked from the loss (never scored 0)"]
    rewards = {s["reward"] for s in siblings if s["reward"] is not None}
    if len(rewards) <= 1:
        return ["   not trained on: every scored rollout of its group had the same reward (no signal; filtered)"]
    return ["   not trained on (yet): no train step has consumed it"]


def _execution(row: dict[str, Any]) -> list[str]:
    """The program that ran and what running it gave (the execute stage's summary)."""
    result = row["exec_result"]
    if not isinstance(result, dict):
        if row["error_kind"] == "sandbox":
            return _block("execution result", "(none: the sandbox failed after its retries; masked, see below)")
        return _block("execution result", "(none: no program ran for this rollout)")
    return _result("program that ran", "execution result", result)


def _turns(row: dict[str, Any]) -> list[str]:
    """A multi-turn episode's transcript: each turn's action (or the program it ran),
    the observation that came back, the turn's execution result and reward parts."""
    lines: list[str] = []
    turns = row.get("turns") or []
    for i, turn in enumerate(turns, 1):
        result = turn.get("exec_result")
        lines += _block(f"turn {i}/{len(turns)}: action", turn["action"])
        if isinstance(result, dict):
            lines += _result(f"turn {i}: program that ran", f"turn {i}: execution result", result)
        lines += _block(f"turn {i}: observation", turn["observation"])
        if turn.get("parts"):
            lines += [f"   turn {i} reward parts: " + ", ".join(f"{k}={v:.4f}" for k, v in turn["parts"].items()), ""]
    return lines


def _result(program_title: str, title: str, result: dict[str, Any]) -> list[str]:
    rest = {k: v for k, v in result.items() if k not in ("program", "stderr", "tests", "report")}
    head = "  ".join(f"{k} {v}" for k, v in rest.items())
    body = [head]
    if result.get("tests") is not None:
        body += [f"test {i}: " + " ".join(f"{k}={v}" for k, v in t.items()) for i, t in enumerate(result["tests"])]
    if result.get("report") is not None:
        body += ["report: " + json.dumps(result["report"], default=str)]
    if result.get("stderr"):
        body += ["stderr (tail):", *result["stderr"].splitlines()[-20:]]
    lines = _block(program_title, result["program"]) if result.get("program") else []
    return lines + _block(title, "\n".join(body))


def _draw(store: Any, row: dict[str, Any]) -> list[str]:
    """The draw the rollout's group was made from and its fate (nothing for a trace without draws)."""
    draw = store.draw_of_group(row["group_id"])
    if draw is None:
        return []
    fate = draw["fate"] or "none yet (in flight)"
    if draw["fate"] == "dropped":
        fate = f"dropped ({draw['reason']})"
    at = f" at step {draw['fate_step']}" if draw["fate_step"] is not None else ""
    return [f"   draw {draw['id']} (drawn at step {draw['step']}): {fate}{at}"]


def explain(store: Any, rollout_id: str) -> str:
    """A readable account of one rollout; ConfigError when the id is unknown."""
    row = store.get(rollout_id)
    if row is None:
        raise ConfigError(f"rollout {rollout_id!r} is not in {store.path}")
    siblings = store.siblings(row)  # the rollouts sampled for the same prompt in the same step
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row["created_at"]))
    reward = "masked (infra error)" if row["reward"] is None else f"{row['reward']:.4f}"
    passed = "-" if row["passed"] is None else ("yes" if row["passed"] else "no")
    sampling = " ".join(f"{k}={v}" for k, v in (row["sampling"] or {}).items())
    parts = ", ".join(f"{k}={v:.4f}" for k, v in (row["parts"] or {}).items()) or "(none)"
    timing = lambda k, v: f"{k}={v * 1000:.2f}ms" if k.endswith("_s") else f"{k}={v:g}"  # noqa: E731 - seconds in ms, counts as is
    timings = ", ".join(timing(k, v) for k, v in (row["timings"] or {}).items()) or "(none)"
    lines = [
        f"rollout {row['id']}  ({when} UTC)",
        f"   task {row['task_id']}  domain {row['domain']}  split {row['split']}  difficulty {row['difficulty']}  "
        f"task set {row['taskset_version']}",
        f"   group {row['group_id']}  model version {row['model_version']}",
        "",
        *_block("prompt", row["prompt"]),
        *_block("sampling parameters", sampling),
        *_block(
            f"completion ({row['completion_tokens']} tokens, finish reason {row['finish_reason']})", row["completion"]
        ),
        *_turns(row),
        *_execution(row),
        f"-- verifier {row['verifier']}",
        f"   reward {reward}  passed {passed}  reason {row['reason'] or '-'}",
        f"   reward parts: {parts}",
        f"   stage timings: {timings}",
    ]
    if row["error_kind"]:
        lines.append(f"   infra error ({row['error_kind']}): {row['error']}")
    lines += ["", "-- training", *_training(row, siblings), *_draw(store, row), ""]
    others = [s for s in siblings if s["id"] != row["id"]]
    if others:
        lines.append(f"-- its group ({len(siblings)} samples of the same prompt)")
        for s in siblings:
            mark = "*" if s["id"] == row["id"] else " "
            r = "masked" if s["reward"] is None else f"{s['reward']:.2f}"
            lines.append(f" {mark} {s['id']}  reward {r:<6} {s['completion'][:60]!r}")
    return "\n".join(lines).rstrip() + "\n"
