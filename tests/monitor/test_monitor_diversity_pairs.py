"""mean_pairwise_edit measures each distinct pair once: the values of a plain loop over every pair."""

from __future__ import annotations

import random
from itertools import combinations

from posttrain.monitor.diversity import mean_pairwise_edit


def _dp(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        prev, row[0] = row[:], i
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
    return row[-1]


def _plain(groups, max_chars):
    out = []
    for group in groups:
        texts = [t[:max_chars] for t in group]
        norms = [_dp(a, b) / max(len(a), len(b), 1) for a, b in combinations(texts, 2)]
        out.append(sum(norms) / len(norms) if norms else 0.0)
    return out


def test_repeated_texts_and_pairs_measure_as_a_plain_loop_does():
    rng = random.Random(1)
    for _ in range(60):
        groups = []
        for _ in range(rng.randint(0, 6)):
            answers = ["".join(rng.choices("ab<>/ 1\n", k=rng.randint(0, 12))) for _ in range(rng.randint(1, 4))]
            groups.append([rng.choice(answers) for _ in range(rng.randint(0, 8))])  # repeats within a group
        groups += [list(g) for g in groups[:2]]  # and across groups
        max_chars = rng.choice([1, 5, 64])
        got = mean_pairwise_edit(groups, max_chars)
        want = _plain(groups, max_chars)
        assert len(got) == len(want)
        assert all(abs(g - w) < 1e-12 for g, w in zip(got, want)), (groups, got, want)


def test_a_collapsed_group_is_zero_and_a_group_of_one_has_no_pairs():
    assert mean_pairwise_edit([["same"] * 8, ["one"], [], ["ab", "ab", "cd"]]) == [0.0, 0.0, 0.0, 2 / 3]


def test_both_forms_of_the_distance_agree_with_the_dp_on_short_and_long_texts():
    from posttrain.monitor.diversity import levenshtein

    rng = random.Random(2)
    for top in (8, 64, 65, 90):  # the bit-vector form up to 64 characters on the shorter side, rows beyond
        a = ["".join(rng.choices("ab\0é\n", k=rng.randint(0, top))) for _ in range(40)]
        b = ["".join(rng.choices("ab\0é\n", k=rng.randint(0, top))) for _ in range(40)]
        a[0], b[1] = "x" * top, ""  # the longest text, and an empty one
        assert levenshtein(a, b).tolist() == [_dp(x, y) for x, y in zip(a, b)]
