"""The trace's row of one rollout: a `Rollout` and how it was sampled, as the `RolloutRecord`
the store writes (the loop writes a step's rows with `rollout_records`, before any train step
consumes them).

Invariant: a row carries the rollout's id from birth, the verifier's score as the verifier gave
it (`reward`; a diversity bonus is a part of its own, `diversity_bonus`), the sampling
parameters with the domain's token budget, and the verifier's label (`name@version`); a
masked rollout (no score) has reward and passed None and its error as its reason.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from posttrain.contracts.budget import Budget
from posttrain.rollout import Rollout
from posttrain.trace import RolloutRecord, exec_summary, transcript
from posttrain.types import SamplingParams, to_dict

Labels = Callable[[str], str]
"""A domain's name to its verifier's label, `name@version` (`domains.registry.verifier_label`)."""


def rollout_records(
    groups: Sequence[Sequence[Rollout]],
    params: SamplingParams,
    labels: Labels,
    budgets: Mapping[str, Budget] | None = None,
) -> list[RolloutRecord]:
    """The rows of every rollout of `groups`, in order; each domain's sampling dict and verifier
    label are built once and shared by its rows (the trace encodes a shared value once)."""
    shared: dict[str, tuple[dict[str, Any], str]] = {}
    return [rollout_record(r, params, labels, budgets, shared) for g in groups for r in g]


def rollout_record(
    r: Rollout,
    params: SamplingParams,
    labels: Labels,
    budgets: Mapping[str, Budget] | None = None,
    shared: dict[str, tuple[dict[str, Any], str]] | None = None,
) -> RolloutRecord:
    """The trace record of `r`. `shared`: per domain, the sampling dict and the verifier's label,
    filled on first use and then shared by every record of the domain made with it."""
    s = r.score
    domain = r.task.domain
    per = shared.get(domain) if shared is not None else None
    if per is None:
        tokens = budgets[domain].tokens if budgets and domain in budgets else None
        per = (dict(_sampling(params, tokens)), labels(domain))
        if shared is not None:
            shared[domain] = per
    return RolloutRecord(
        task_id=r.task.id,
        domain=r.task.domain,
        split=r.task.meta.split,
        difficulty=r.task.meta.difficulty,
        taskset_version=r.task.meta.taskset_version,
        group_id=r.group_id,
        model_version=r.completion.model_version,
        sampling=per[0],
        prompt=r.prompt_text,
        completion=r.completion.text,
        completion_tokens=len(r.completion.token_ids),
        finish_reason=r.completion.finish_reason,
        reward=None if s is None else s.value,
        passed=None if s is None else s.passed,
        parts={} if s is None else _parts(s.parts, r.diversity_bonus),
        reason=r.error or ("" if s is None else s.reason),
        verifier=per[1],
        timings=dict(r.timings),
        error_kind=r.error_kind,
        error=r.error,
        exec_result=exec_summary(r.exec_result),
        turns=transcript(r.turns),
        retries=r.retries,
        id=r.id,
    )


@functools.lru_cache(maxsize=256)
def _sampling(params: SamplingParams, max_tokens: int | None) -> dict[str, Any]:
    """The trace's view of the sampling parameters (with the domain's token budget), built
    once per distinct value: every rollout of a domain shares it. Callers copy it."""
    return to_dict(params if max_tokens is None else dataclasses.replace(params, max_tokens=max_tokens))


def _parts(parts: Mapping[str, float], bonus: float | None) -> dict[str, float]:
    """The trace's score parts: the verifier's, and the diversity bonus apart (the record's
    `reward` stays the verifier's)."""
    return dict(parts) if bonus is None else {**parts, "diversity_bonus": bonus}
