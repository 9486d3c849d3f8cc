"""Answer equivalence with math-verify, in worker processes with a timeout.

Invariant: model text is only ever parsed by math-verify's LaTeX extractor
(latex2sympy, an ANTLR grammar) inside a spawned worker process, never by
`sympy.parse_expr` (which evaluates code) and never in the caller's process.
math-verify's own timeout (signal based) works there because the worker runs
it on its main thread; a worker that still overruns the outer deadline is
killed and the call raises VerifierError (infra, never reward 0). One call
holds the worker at a time (`_slot`): the deadline runs from when its check
starts, never while it waits for other samples' checks, and killing the
worker for one answer never cancels or fails another sample's check.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import multiprocessing
import threading

from posttrain.errors import VerifierError

INNER_TIMEOUT_S = 3
OUTER_TIMEOUT_S = 30.0
MAX_ANSWER_CHARS = 2000

_lock = threading.Lock()
_pool: cf.ProcessPoolExecutor | None = None
_slot = threading.Lock()  # the one worker's turn: held from a check's submission to its result


def _latex(text: str) -> str:
    text = text.strip()
    if "$" in text or "\\boxed" in text or "\\[" in text or "\\(" in text:
        return text
    return f"${text}$"


def check(gold: str, answer: str) -> bool:
    """Runs in the worker: is `answer` mathematically equivalent to `gold`?"""
    from math_verify import LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig()]
    parsed_gold = parse(_latex(gold), config, parsing_timeout=INNER_TIMEOUT_S)
    parsed = parse(_latex(answer), config, parsing_timeout=INNER_TIMEOUT_S)
    if not parsed_gold:
        raise ValueError(f"reference {gold!r} does not parse")
    if not parsed:
        return False
    return bool(verify(parsed_gold, parsed, timeout_seconds=INNER_TIMEOUT_S))


def _warm() -> bool:
    import math_verify  # noqa: F401

    return True


def _get_pool() -> cf.ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return _pool


def _kill_pool() -> None:
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)


atexit.register(_kill_pool)


def equivalent(gold: str, answer: str) -> bool:
    """True when `answer` equals `gold` (a LaTeX reference) mathematically.
    An identical string is decided here; anything else goes to a worker."""
    answer = answer.strip()
    if answer == gold.strip():
        return True
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return False
    with _slot:
        return _run(gold, answer)


def _run(gold: str, answer: str) -> bool:
    """`check(gold, answer)` in the worker within OUTER_TIMEOUT_S; the caller holds `_slot`."""
    future = _get_pool().submit(check, gold, answer)
    try:
        return future.result(timeout=OUTER_TIMEOUT_S)
    except cf.TimeoutError:
        _kill_pool()
        raise VerifierError(
            f"math-verify worker exceeded {OUTER_TIMEOUT_S}s on answer of {len(answer)} chars"
        ) from None
    except (cf.process.BrokenProcessPool, cf.CancelledError) as exc:
        _kill_pool()
        raise VerifierError(f"math-verify worker died: {exc}") from exc
    except ValueError as exc:  # raised on this answer: the verify boundary blames it by its cause
        raise ValueError(f"math-verify: {exc}") from exc


def warm_up() -> None:
    """Start the worker and import math-verify in it (optional; the first call does it anyway)."""
    _get_pool().submit(_warm).result(timeout=120)


def shutdown() -> None:
    _kill_pool()
