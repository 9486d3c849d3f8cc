"""Within-group output diversity: distinct answers, distinct-n, mean pairwise edit distance.

Invariant: every measure is in [0, 1], falls as a group's completions grow
alike (edit distance is 0 and distinct answers 1/G for G identical texts)
and depends only on the completion texts, so the same group always
measures the same. The edit distance is exact
Levenshtein (vectorised over all pairs, one numpy pass per character row).
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


def levenshtein(a: Sequence[str], b: Sequence[str]) -> np.ndarray:
    """Edit distance of a[p] to b[p] for every pair p (insert, delete, substitute cost 1)."""
    if len(a) != len(b):
        raise ValueError(f"levenshtein: {len(a)} left strings but {len(b)} right strings")
    if not a:
        return np.zeros(0, dtype=np.int64)
    texts = [*a, *b]
    codes = _encode(texts, max(1, max(map(len, texts))))
    n = len(a)
    return _distances(codes, np.array([len(t) for t in texts]), np.arange(n), np.arange(n, 2 * n))


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
    left, right, owner = [], [], []
    for g, group in enumerate(groups):
        if len(group) < 2:
            continue
        ids = np.array([index.setdefault(t[:max_chars], len(index)) for t in group])
        i, j = _pairs(len(group))
        left.append(ids[i])
        right.append(ids[j])
        owner.append(np.full(len(i), g))
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
        dist[differ] = _distances(codes, lengths, ua, ub)[inverse.reshape(-1)]
    longest = np.maximum(lengths[li], lengths[ri])
    norm = np.where(longest > 0, dist / np.maximum(longest, 1), 0.0)
    sums = np.bincount(own, weights=norm, minlength=len(groups))
    counts = np.bincount(own, minlength=len(groups))
    return [float(s / c) if c else 0.0 for s, c in zip(sums, counts)]
