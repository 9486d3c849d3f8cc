"""A Python callable as a verifier, by import path, in worker processes with a time limit.

Invariant: user code never runs in the trainer's process: the callable is
imported and called only in spawned worker processes (the current directory
is importable there). An import that fails is a ConfigError at build time,
before training. An exception the callable raises on a completion, or a
result that is not a bool, a number in [0, 1] or {value, parts, passed,
reason}, raises ModelFault: the completion made the user's code fail, so the
verify boundary scores it 0 with the reason, unless its cause test finds the
callable fails on the task's gold answer too (then it is the verifier's
fault: masked and counted, never reward 0). A call past `timeout_s` or a
worker that dies raises VerifierError (infra: masked and counted). A call
past its time limit kills the workers; the next call starts fresh ones. At
most `workers` calls are in the workers at once (the others wait their turn
before their time limit starts, so a queue never times a call out), and a
call that was in flight on the killed workers for another sample is run again
on the fresh ones (once per kill, at most MAX_RERUNS times), so one sample's
timeout never masks its group-mates.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import importlib
import inspect
import math
import multiprocessing
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from posttrain.configs.byo import PythonParams
from posttrain.errors import ConfigError, ModelFault, VerifierError
from posttrain.types import Episode, Score, Task

KEYWORDS = ("completion", "answer", "prompt", "messages", "metadata", "task_id")
_FNS: dict[str, tuple[Callable[..., Any], frozenset[str] | None]] = {}


def _load(path: str) -> tuple[Callable[..., Any], frozenset[str] | None]:
    """Runs in the worker: the callable and the keywords it takes (None: it takes **kwargs)."""
    if path not in _FNS:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        module, _, attr = path.partition(":")
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        if not callable(obj):
            raise TypeError(f"{path} is a {type(obj).__name__}, not a callable")
        params = inspect.signature(obj).parameters.values()
        takes_all = any(p.kind is p.VAR_KEYWORD for p in params)
        _FNS[path] = (obj, None if takes_all else frozenset(p.name for p in params))
    return _FNS[path]


def probe(path: str) -> str | None:
    """Runs in the worker: None when `path` imports to a callable, else the reason."""
    try:
        fn, names = _load(path)
    except Exception as exc:  # noqa: BLE001 - the user's import
        return f"{type(exc).__name__}: {exc}"
    if names is not None and not names & set(KEYWORDS):
        return f"it takes none of the keywords {', '.join(KEYWORDS)}"
    return None


def call(path: str, kwargs: dict[str, Any]) -> tuple[str, Any]:
    """Runs in the worker: ("ok", result) or ("error", traceback text)."""
    try:
        fn, names = _load(path)
        args = kwargs if names is None else {k: v for k, v in kwargs.items() if k in names}
        return "ok", fn(**args)
    except Exception:  # noqa: BLE001 - the user's code
        return "error", traceback.format_exc(limit=4)[-1500:]


def to_score(result: Any, threshold: float, path: str) -> Score:
    """A callable's result as a Score; anything else is a VerifierError."""
    if isinstance(result, Score):
        return result
    if isinstance(result, dict):
        value = result.get("value")
        parts = result.get("parts") or {}
        if not isinstance(parts, dict) or not all(isinstance(v, (int, float)) for v in parts.values()):
            raise VerifierError(f"{path} returned parts that are not a mapping of names to numbers: {parts!r}")
        score = to_score(value, threshold, path)
        passed = bool(result.get("passed", score.passed))
        return Score(
            score.value,
            {"outcome": score.value, **{str(k): float(v) for k, v in parts.items()}},
            passed,
            str(result.get("reason", "")),
        )
    if isinstance(result, bool):
        return Score(float(result), {"outcome": float(result)}, result, "" if result else "rejected")
    if isinstance(result, (int, float)) and math.isfinite(result) and 0.0 <= result <= 1.0:
        value = float(result)
        return Score(value, {"outcome": value}, value >= threshold, "" if value >= threshold else "below threshold")
    raise VerifierError(
        f"{path} returned {result!r}: expected a bool, a number in [0, 1] or {{value, parts, passed, reason}}"
    )


MAX_RERUNS = 3
"""Times a call is run again because another call's timeout killed its workers."""


class CallableVerifier:
    """Scores with `params.path`, called with the keywords it accepts among KEYWORDS."""

    name = "python"
    programmatic = False

    def __init__(self, params: PythonParams) -> None:
        self.params = params
        self.version = params.path
        self._lock = threading.Lock()
        self._pool: cf.ProcessPoolExecutor | None = None
        self._kills = 0  # pools killed so far: a call on a killed pool it did not kill runs again
        self._slots = threading.BoundedSemaphore(params.workers)  # calls in the workers, never queued there
        atexit.register(self.close)
        problem = self._submit(probe, params.path).result(timeout=max(params.timeout_s, 60.0))
        if problem is not None:
            self.close()
            raise ConfigError(f"verifier python: cannot use {params.path!r}: {problem}")

    def __getstate__(self) -> dict[str, Any]:
        return {"params": self.params}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.params, self.version = state["params"], state["params"].path
        self._lock, self._pool, self._kills = threading.Lock(), None, 0
        self._slots = threading.BoundedSemaphore(self.params.workers)

    def _submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        return self._submit_counted(fn, *args)[0]

    def _submit_counted(self, fn: Callable[..., Any], *args: Any) -> tuple[cf.Future, int]:
        """(the future of `fn(*args)` on the pool, the kill count when it was submitted)."""
        with self._lock:
            if self._pool is None:
                self._pool = cf.ProcessPoolExecutor(
                    self.params.workers, mp_context=multiprocessing.get_context("spawn")
                )
            return self._pool.submit(fn, *args), self._kills

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            self._kills += pool is not None
        if pool is not None:
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.kill()
            pool.shutdown(wait=False, cancel_futures=True)

    def score(self, task: Task, episode: Episode) -> Score:
        ref = task.reference
        kwargs = {
            "completion": episode.completion,
            "answer": ref.answer,
            "prompt": task.prompt[-1].content,
            "messages": [{"role": m.role, "content": m.content} for m in task.prompt],
            "metadata": dict(ref.metadata),
            "task_id": task.id,
        }
        with self._slots:  # the time limit runs from the call's start, not its wait for a worker
            status, result = self._call(kwargs)
        if status == "error":
            raise ModelFault(f"{self.params.path} raised: {result.strip().splitlines()[-1][:300]}")
        try:
            return to_score(result, self.params.pass_threshold, self.params.path)
        except VerifierError as exc:  # what it returned for this completion is not a score
            raise ModelFault(str(exc)[:300]) from None

    def _call(self, kwargs: dict[str, Any]) -> tuple[str, Any]:
        """`call(path, kwargs)` in a worker within `timeout_s`. A call whose workers another
        call's timeout killed meanwhile runs again (at most MAX_RERUNS times); its own timeout
        or a worker that died under it is a VerifierError."""
        for _ in range(MAX_RERUNS + 1):
            future, kills = self._submit_counted(call, self.params.path, kwargs)
            try:
                return future.result(timeout=self.params.timeout_s)  # type: ignore[no-any-return]
            except cf.TimeoutError:
                with self._lock:
                    killed_by_another = self._kills != kills
                if killed_by_another:  # its workers died under another call's timeout before word reached it
                    continue
                self.close()
                raise VerifierError(f"{self.params.path} ran past its {self.params.timeout_s}s time limit") from None
            except (cf.process.BrokenProcessPool, cf.CancelledError) as exc:
                with self._lock:
                    killed_by_another = self._kills != kills
                if not killed_by_another:
                    self.close()
                    raise VerifierError(f"{self.params.path}: its worker process died ({exc})") from None
        raise VerifierError(
            f"{self.params.path}: its workers were killed {MAX_RERUNS + 1} times by other calls' timeouts"
        )

    def gold(self, task: Task) -> str | None:
        return str(task.reference)

    def wrong(self, task: Task) -> str:
        return "\u2205"
