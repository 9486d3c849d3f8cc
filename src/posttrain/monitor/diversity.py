"""Within-group output diversity: distinct answers, distinct-n, mean pairwise edit distance.

Invariant: every measure is in [0, 1], falls as a group's completions grow
alike (edit distance is 0 and distinct answers 1/G for G identical texts)
and depends only on the completion texts, so the same group always
measures the same. The edit distance is exact
Levenshtein, vectorised over all pairs: Hyyro's bit-vector recurrence (one
uint64 per pair, one numpy pass per character) when the shorter text of every
pair has at most 64 characters, else one numpy pass per character row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from posttrain.domains.base import extract_answer


def distinct_answers(texts: Sequence[str]) -> float:
    """Distinct extracted answers / group size (1/G when all agree, 1 when all differ)."""
    if not texts:
        return 0.0
    return len({extract_answer(t) for t in texts}) / len(texts)


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Distinct character n-grams / all n-grams over the group (0 when no text has n characters)."""
    grams = [t[i : i + n] for t in texts for i in range(len(t) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def _encode(texts: Sequence[str], width: int) -> np.ndarray:
    """Code points, one row per text, right-padded with -1 (one encode for all texts)."""
    joined = "".join(t.ljust(width, "\0") for t in texts).encode("utf-32-le")
    out = np.frombuffer(joined, dtype=np.uint32).reshape(len(texts), width).astype(np.int64)
    out[np.arange(width)[None, :] >= np.array([len(t) for t in texts])[:, None]] = -1
    return out


def _distances(codes: np.ndarray, lengths: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Edit distance of text left[p] to text right[p]; pads (-1 left, -2 right) never match."""
    ca, cb = codes[left], np.where(codes[right] < 0, -2, codes[right])
    len_a, len_b = lengths[left], lengths[right]
    wa, wb = ca.shape[1], cb.shape[1]
    cols = np.arange(wb + 1)
    prev = np.broadcast_to(cols, (len(left), wb + 1)).copy()
    result = np.where(len_a == 0, len_b, 0)
    for i in range(1, wa + 1):
        cost = (ca[:, i - 1 : i] != cb).astype(np.int64)  # P x wb
        diag_or_up = np.minimum(prev[:, 1:] + 1, prev[:, :-1] + cost)
        # left dependency: cur[j] = min_k<=j (base[k] + j - k), a running minimum of base - k
        base = np.concatenate([np.full((len(left), 1), i), diag_or_up], axis=1)
        cur = np.minimum.accumulate(base - cols, axis=1) + cols
        done = len_a == i
        result[done] = cur[done, len_b[done]]
        prev = cur
    return result


def _bit_distances(codes: np.ndarray, lengths: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """`_distances` for left texts of at most 64 characters, by Hyyro's bit-vector form of the
    Levenshtein recurrence (one uint64 column of the DP table per pair; Myers 1999, Hyyro 2001):
    one pass per character of the right texts, O(pairs) work each instead of O(pairs x width).
    Bits above a left text's length only ever carry into higher bits, never into the ones read."""
    width = codes.shape[1]
    alphabet, idx = np.unique(codes, return_inverse=True)  # pads (-1) included: masked out below
    idx = idx.reshape(codes.shape)
    k = len(alphabet)
    valid = np.arange(width)[None, :] < lengths[:, None]
    t, i = np.nonzero(valid)
    keys = t * k + idx[t, i]
    order = np.argsort(keys, kind="stable")
    keys, bits = keys[order], (np.uint64(1) << i[order].astype(np.uint64))
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, dtype=np.int64)
    peq = np.zeros(len(codes) * k, dtype=np.uint64)  # peq[text * k + char]: where the char occurs in the text
    if len(keys):
        peq[keys[starts]] = np.bitwise_or.reduceat(bits, starts)
    len_a, len_b = lengths[left], lengths[right]
    result = np.where(len_a == 0, len_b, len_a).astype(np.int64)
    live = np.flatnonzero((len_a > 0) & (len_b > 0))
    live = live[np.argsort(-len_b[live], kind="stable")]  # longest right text first: a prefix stays active
    row = left[live] * k
    rchars = idx[right[live]]
    top = np.uint64(1) << (len_a[live] - 1).astype(np.uint64)
    n = len(live)
    pv = np.full(n, np.iinfo(np.uint64).max, dtype=np.uint64)
    mv = np.zeros(n, dtype=np.uint64)
    score = len_a[live].astype(np.int64)
    one = np.uint64(1)
    steps = np.searchsorted(-len_b[live], -np.arange(1, int(len_b.max(initial=0)) + 1), side="right")
    for j, active in enumerate(steps):  # pairs [0, active) have a j-th right character
        if not active:
            break
        eq = peq[row[:active] + rchars[:active, j]]
        p, m = pv[:active], mv[:active]
        xv = eq | m
        xh = (((eq & p) + p) ^ p) | eq
        ph = m | ~(xh | p)
        mh = p & xh
        score[:active] += (ph & top[:active] != 0).astype(np.int64) - (mh & top[:active] != 0)
        ph = (ph << one) | one
        mh = mh << one
        pv[:active] = mh | ~(xv | ph)
        mv[:active] = ph & xv
    result[live] = score
    return np.asarray(result)


def _pair_distances(codes: np.ndarray, lengths: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Edit distance of text left[p] to text right[p]: the distance is symmetric, so each pair is
    taken shorter text first, and the bit-vector form measures it when every shorter text fits in
    64 bits (the default `diversity.max_chars` is 64); the row-by-row form otherwise."""
    swap = lengths[left] > lengths[right]
    short, long_ = np.where(swap, right, left), np.where(swap, left, right)
    if not len(short) or int(lengths[short].max()) <= 64:
        return _bit_distances(codes, lengths, short, long_)
    return _distances(codes, lengths, short, long_)


def levenshtein(a: Sequence[str], b: Sequence[str]) -> np.ndarray:
    """Edit distance of a[p] to b[p] for every pair p (insert, delete, substitute cost 1)."""
    if len(a) != len(b):
        raise ValueError(f"levenshtein: {len(a)} left strings but {len(b)} right strings")
    if not a:
        return np.zeros(0, dtype=np.int64)
    texts = [*a, *b]
    codes = _encode(texts, max(1, max(map(len, texts))))
    n = len(a)
    return _pair_distances(codes, np.array([len(t) for t in texts]), np.arange(n), np.arange(n, 2 * n))


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (i < j) of n items, in `itertools.combinations` order."""
    got = _PAIRS.get(n)
    if got is None:
        got = _PAIRS[n] = np.triu_indices(n, 1)
    return got


_PAIRS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def mean_pairwise_edit(groups: Sequence[Sequence[str]], max_chars: int = 64) -> list[float]:
    """Per group: mean over pairs of edit distance / longer length (0 for identical texts).
    One vectorised pass covers every pair of every group; each distinct text is encoded once and
    each distinct pair of distinct texts measured once (a group's repeated answers cost nothing;
    the distance is symmetric). The per-pair values and their summing order are those of a plain
    loop over `itertools.combinations` of each group."""
    index: dict[str, int] = {}  # distinct (truncated) text -> its number
    numbers = [index.setdefault(t[:max_chars], len(index)) for group in groups for t in group]
    sizes = np.array([len(g) for g in groups], dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    flat = np.array(numbers, dtype=np.int64)
    left, right, owner = [], [], []
    for size in sorted({int(n) for n in sizes if n >= 2}):  # the groups of one size at once
        of_size = np.flatnonzero(sizes == size)
        i, j = _pairs(size)
        base = starts[of_size][:, None]
        left.append(flat[(base + i).ravel()])
        right.append(flat[(base + j).ravel()])
        owner.append(np.repeat(of_size, len(i)))
    out = [0.0] * len(groups)
    if not left:
        return out
    texts = list(index)
    lengths = np.array([len(t) for t in texts])
    li, ri, own = np.concatenate(left), np.concatenate(right), np.concatenate(owner)
    dist = np.zeros(len(li), dtype=np.int64)
    differ = li != ri  # the same text twice: distance 0
    if differ.any():
        lo, hi = np.minimum(li[differ], ri[differ]), np.maximum(li[differ], ri[differ])
        keys, inverse = np.unique(lo * len(texts) + hi, return_inverse=True)
        ua, ub = keys // len(texts), keys % len(texts)
        codes = _encode(texts, max(1, int(lengths.max())))
        dist[differ] = _pair_distances(codes, lengths, ua, ub)[inverse.reshape(-1)]
    longest = np.maximum(lengths[li], lengths[ri])
    norm = np.where(longest > 0, dist / np.maximum(longest, 1), 0.0)
    sums = np.bincount(own, weights=norm, minlength=len(groups))
    counts = np.bincount(own, minlength=len(groups))
    return [float(s / c) if c else 0.0 for s, c in zip(sums, counts)]
