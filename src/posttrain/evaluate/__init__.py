"""Held-out evaluation: distinct versioned held-out sets, intervals, paired deltas,
sampled metrics, strict eval verifiers, contamination and exposure checks.

`posttrain.evaluate` keeps its old names (`evaluate`, `EvalTable`, `DomainResult`,
`eval_tasks`, `format_table`, `write_table`); the parts live in submodules:
`heldout` (the sets), `core` (running them), `stats` (intervals), `strict`
(eval verifiers), `tables` (text and JSON), `exposure` (base-model exposure),
`compare` (two models on the same items).
"""

from posttrain.evaluate.core import (
    DomainResult,
    EvalOptions,
    EvalTable,
    eval_tasks,
    evaluate,
    evaluate_heldout,
    evaluate_sets,
)
from posttrain.evaluate.heldout import DomainSet, HeldoutSet, build_heldout, rotation_slice
from posttrain.evaluate.tables import format_details, format_probes, format_table, format_turns, write_table

__all__ = [
    "DomainResult",
    "DomainSet",
    "EvalOptions",
    "EvalTable",
    "HeldoutSet",
    "build_heldout",
    "eval_tasks",
    "evaluate",
    "evaluate_heldout",
    "evaluate_sets",
    "format_details",
    "format_probes",
    "format_table",
    "format_turns",
    "rotation_slice",
    "write_table",
]
