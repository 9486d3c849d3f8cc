"""Per-domain budgets: tokens per turn, turns and seconds for each domain of a run, and the
execute step that runs within them.

Invariant: a domain's budget is its declaration (`Domain.budget`), each field
replaced where `tasks.domains.<name>` sets it (max_tokens, max_turns,
max_seconds), and its tokens then capped by the run-wide cap when one is set
(`rollout.max_tokens` in training, `eval.max_tokens` in evaluation); training
(loop.py) and evaluation (evaluate/core.py `eval_budgets`) resolve budgets with
`domain_budget`, and both build the execute step with `execute_of` from the
run's sandbox section, so a domain is evaluated with the budget and under the
execute caps it is trained with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from posttrain.configs.tasks import DomainSpec
from posttrain.domains.base import Budget
from posttrain.domains.base import domain_budget as domain_budget  # the rule's home (the task pool reads it too)
from posttrain.pipeline.workers import DomainExecute


def domain_budgets(
    names: Iterable[str], specs: Mapping[str, DomainSpec] | None = None, cap: int | None = None
) -> dict[str, Budget]:
    """Effective budgets of the named registered domains."""
    from posttrain.domains.registry import get

    specs = specs or {}
    return {n: domain_budget(get(n), specs.get(n), cap) for n in names}


def execute_of(sandbox: Any, budgets: Mapping[str, Budget]) -> DomainExecute:
    """The run's execute step: each domain's declared one on the pool `sandbox` configures
    (the run's `sandbox` section, or None), each run capped at `sandbox.max_memory_mb` / `max_wall_s` and
    the domain's budget seconds."""
    seconds = {n: b.seconds for n, b in budgets.items()}
    if sandbox is None:  # no run's sandbox section (a bare evaluation): the pool as configured
        return DomainExecute(seconds=seconds)
    return DomainExecute(sandbox.pool_config(), sandbox.max_memory_mb, sandbox.max_wall_s, seconds)
