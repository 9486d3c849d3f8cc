"""What an engine returns is checked before anything scores or trains on it: a completion that lies
is the engine's fault, never the model's sample.

Invariant: every completion an engine's `generate` returns has passed `screen` (hf, vllm and
openai call it on their way out, so every caller, training, evaluation, episode play and the
probe, gets screened completions): its token ids lie in [0, vocabulary); it has one log-prob
per token, each finite and at most LOGPROB_EPS above 0 (a probability above 1 is impossible);
no more tokens than the request's max_tokens; its text is a prefix of the decoding of its ids
(the engine may cut it at a stop string, never add to it); its prompt is the request's; and
the weight version it claims lies between the engine's acknowledged version when the call
began and when it returned (a server that claims weights it was never sent, or older ones than
it acknowledged, lies). A completion that fails is replaced by an empty one (finish reason
"error") whose `fault` names what was wrong (`EngineFault`'s message); the pipeline masks that
sample alone with kind "engine" and counts it (its group-mates and batch-mates go on), and
`FaultTally` in the run's guard (engine/guard.py) stops the run when the engine keeps lying.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from posttrain.types import Completion, GenerationRequest

LOGPROB_EPS = 1e-4
"""A log-prob above 0 by at most this is float rounding of a near-certain token (float32 log_softmax
gives ~1e-7); above it is a probability over 1: a lie."""


def fault_of(
    req: GenerationRequest,
    c: Completion,
    vocab: int,
    versions: tuple[int, int],
    decode: Callable[[Sequence[int]], str] | None = None,
) -> str:
    """Why `c`, returned for `req`, cannot be a sample of the model ("" when it can). `vocab`: the
    ids the engine's model has; `versions`: the engine's acknowledged version at the call's start
    and end; `decode`: the engine's tokenizer (None: the text is not checked)."""
    ids, lps = c.token_ids, c.logprobs
    if tuple(c.prompt_ids) != tuple(req.prompt_ids):
        return "the completion's prompt is not the request's"
    bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < vocab)]
    if bad:
        return f"token ids outside the vocabulary [0, {vocab}): {bad[:5]}"
    if len(lps) != len(ids):
        return f"{len(ids)} token ids but {len(lps)} log-probs"
    wrong = [(i, x) for i, x in enumerate(lps) if not (math.isfinite(x) and x <= LOGPROB_EPS)]
    if wrong:
        i, x = wrong[0]
        return f"{len(wrong)} impossible log-probs (finite and <= 0 required), e.g. {x!r} at token {i}"
    if len(ids) > req.params.max_tokens:
        return f"{len(ids)} tokens for max_tokens {req.params.max_tokens}"
    lo, hi = versions
    if not (lo <= c.model_version <= hi):
        return f"claims weight version {c.model_version}, the engine acknowledged {lo} to {hi} during the call"
    if decode is not None and c.text and not decode(ids).startswith(c.text):
        return f"its text ({len(c.text)} characters) is not what its {len(ids)} token ids decode to"
    return ""


def faulted(c: Completion, reason: str) -> Completion:
    """The empty completion that stands for `c` once it failed the check: no tokens, finish reason
    "error", the reason in `fault`."""
    return Completion(c.prompt_ids, (), "", (), "error", c.model_version, fault=f"engine fault: {reason}")


def screen(
    requests: Sequence[GenerationRequest],
    outs: Sequence[Sequence[Completion]],
    vocab: int,
    versions: tuple[int, int],
    decode: Callable[[Sequence[int]], str] | None = None,
) -> list[list[Completion]]:
    """`outs` (each request's completions) with every completion that fails `fault_of` replaced
    by `faulted`; the rest as they are."""
    return [
        [faulted(c, why) if (why := fault_of(req, c, vocab, versions, decode)) else c for c in group]
        for req, group in zip(requests, outs)
    ]
