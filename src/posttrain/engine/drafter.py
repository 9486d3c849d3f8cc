"""A model-free drafter for speculative decoding: suffix matching over what the loop already has.

The one implementation both users share: the hf engine's speculative rollouts (engine/hf.py)
and the serving fast tier (`SuffixDrafter` in serve/spec.py, an adapter over these classes).

Invariant: a proposal is a pure function of what was added, in the order it was added (no
clock, no randomness, no hashing that varies between runs), and the memory held is bounded:
`TaskStore` keeps at most `max_tasks` x `per_task` past completions of at most `max_len`
tokens each; a `SuffixIndex` keeps at most `keep` occurrences per n-gram of its own
sequences, so at most max_n entries per token it holds (and it lives for one engine call, or
one served sequence). `keep` is larger than a group, so samples in lockstep at the same
position (whose own occurrences have no continuation yet) do not push a useful older one out.
Drafts only ever change speed, never what the engine emits (engine/hf.py and serve/spec.py
verify every drafted token against the model).

Sources, all in one `SuffixIndex` per request of an engine call: the prompt, the past
completions `TaskStore` holds for the same prompt (earlier rollouts of the same task, or
earlier requests and samples in serving), and the outputs of the request's samples as they are
generated (each row sees its siblings' and its own). `propose` finds the longest suffix of a
row's context (up to `max_n` tokens, at least `min_n`) that occurred before and proposes the
tokens that followed it, extended by a shorter suffix's continuation that agrees with it.
`DraftLength` adapts how many: doubled after a fully accepted draft, halved after a rejection.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class TaskStore:
    """Past completions' token ids per task (keyed by prompt ids), bounded: the `per_task`
    latest completions of the `max_tasks` most recently stored tasks, each cut to its first
    `max_len` tokens."""

    def __init__(self, max_tasks: int = 4096, per_task: int = 8, max_len: int = 1024) -> None:
        if max_tasks < 0 or per_task < 0 or max_len < 0:
            raise ValueError(f"TaskStore bounds must be >= 0, got {max_tasks}, {per_task}, {max_len}")
        self.max_tasks, self.per_task, self.max_len = max_tasks, per_task, max_len
        self._tasks: OrderedDict[tuple[int, ...], list[tuple[int, ...]]] = OrderedDict()

    def add(self, prompt: Sequence[int], completion: Sequence[int]) -> None:
        """Keep `completion` (its first `max_len` tokens) as a past rollout of `prompt`."""
        if not self.max_tasks or not self.per_task or not completion:
            return
        key = tuple(prompt)
        kept = self._tasks.pop(key, [])
        kept.append(tuple(completion[: self.max_len]))
        self._tasks[key] = kept[-self.per_task :]
        while len(self._tasks) > self.max_tasks:
            self._tasks.popitem(last=False)

    def get(self, prompt: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """The kept completions of `prompt`, oldest first (none: an empty tuple)."""
        return tuple(self._tasks.get(tuple(prompt), ()))

    def tokens(self) -> int:
        """Tokens held, over every task."""
        return sum(len(c) for cs in self._tasks.values() for c in cs)

    def __len__(self) -> int:
        return len(self._tasks)


class SuffixIndex:
    """Sequences sharing one prompt and an index of their n-grams (1 <= n <= max_n), each
    n-gram mapped to its latest `keep` occurrences (sequence, where its continuation starts).

    A sequence is a `prefix` (the prompt's last max_n - 1 tokens, so n-grams that straddle the
    prompt's end are found) followed by its own tokens; the n-grams ending in its own tokens are
    indexed, and those of the prefix as followed by its first tokens (so a row that has only its
    prompt finds what past completions and siblings began with). The prompt itself is sequence
    0, with no prefix."""

    def __init__(self, prompt: Sequence[int], max_n: int = 8, keep: int = 32) -> None:
        if max_n < 1 or keep < 1:
            raise ValueError(f"SuffixIndex needs max_n >= 1 and keep >= 1, got {max_n}, {keep}")
        self.max_n, self.keep = max_n, keep
        self._prompt = tuple(prompt)
        self._seqs: list[list[int]] = []
        self._starts: list[int] = []  # where each sequence's own tokens start (after its prefix)
        self._grams: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        self.add_sequence((), prefixed=False)
        self.extend(0, self._prompt)

    def add_sequence(self, tokens: Sequence[int] = (), prefixed: bool = True) -> int:
        """A new sequence (after the prompt's tail when `prefixed`) holding `tokens`; its id."""
        prefix = list(self._prompt[len(self._prompt) - (self.max_n - 1) :]) if prefixed and self.max_n > 1 else []
        self._seqs.append(prefix)
        self._starts.append(len(prefix))
        sid = len(self._seqs) - 1
        for n in range(1, len(prefix) + 1):  # the prompt's tail, followed by this sequence's tokens
            self._note(tuple(prefix[len(prefix) - n :]), sid, len(prefix))
        self.extend(sid, tokens)
        return sid

    def _note(self, key: tuple[int, ...], sid: int, end: int) -> None:
        occ = self._grams.get(key)
        if occ is None:
            self._grams[key] = [(sid, end)]
        else:
            occ.append((sid, end))
            if len(occ) > self.keep:
                del occ[0]

    def extend(self, sid: int, tokens: Sequence[int]) -> None:
        """Append `tokens` to sequence `sid` and index the n-grams they end."""
        seq = self._seqs[sid]
        for tok in tokens:
            seq.append(int(tok))
            end = len(seq)
            for n in range(1, min(self.max_n, end) + 1):
                self._note(tuple(seq[end - n : end]), sid, end)

    def propose(self, context: Sequence[int], k: int, min_n: int = 1) -> list[int]:
        """Up to `k` tokens: what followed the longest suffix of `context` (at most max_n
        tokens, at least `min_n`) seen in any sequence; among its occurrences the latest with a
        full k-token continuation, else the one with the longest. When that is shorter than k,
        a shorter suffix's continuation that begins with it extends it (the same choice among
        that suffix's occurrences), down to `min_n`. Empty when nothing matches or k < 1."""
        best: list[int] = []
        if k < 1 or not context:
            return best
        for n in range(min(self.max_n, len(context)), max(min_n, 1) - 1, -1):
            base = best  # what the longer suffixes proposed: a shorter one's continuation must begin with it
            for sid, end in reversed(self._grams.get(tuple(context[len(context) - n :]), ())):
                follow = self._seqs[sid][end : end + k]
                if len(follow) > len(best) and follow[: len(base)] == base:
                    best = follow
                    if len(best) == k:
                        return best
        return best

    def sequence(self, sid: int) -> list[int]:
        """Sequence `sid`'s own tokens (without its prefix)."""
        return self._seqs[sid][self._starts[sid] :]


class DraftLength:
    """The adaptive draft length of one row: starts at `start`, doubles (to at most `most`)
    after a draft accepted in full, halves (to at least 1) after a rejected one."""

    def __init__(self, most: int, start: int | None = None) -> None:
        if most < 1:
            raise ValueError(f"DraftLength needs most >= 1, got {most}")
        self.most = most
        self.value = max(1, min(most, start if start is not None else min(4, most)))

    def update(self, proposed: int, accepted: int) -> None:
        """After a draft of `proposed` tokens of which the first `accepted` were accepted."""
        if proposed < 1:
            return
        if accepted >= proposed:
            self.value = min(self.most, self.value * 2)
        else:
            self.value = max(1, self.value // 2)
