"""The draw ledger: every task the pool hands out gets a draw id and, later, one fate.

Invariant: each task registered with `drawn` has a deterministic id (the
loop step that drew it and its place among that step's draws:
`trace.draw_id`) and is given at most one fate, `trained` or `dropped` with
a reason (`trace.DROP_REASONS`); `flush` writes the draws and fates decided
since the last flush to the trace in one transaction, which the loop does at
the end of every step, before any checkpoint: a checkpoint's pool state
never holds a draw its trace mark does not. A draw with no fate is in flight
(its group not finished, or finished and not yet trained or dropped).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posttrain.rollout import Rollout, informative
from posttrain.trace import DROP_REASONS, DrawRecord, draw_id
from posttrain.types import Task


class DrawLedger:
    """One run's draws in memory, between flushes (StepRollouts.ledger)."""

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self._open: dict[str, DrawRecord] = {}
        """Draws with no fate yet, by id."""
        self._by_group: dict[str, str] = {}
        """Group id -> the draw it was made from (open draws only)."""
        self._dirty: dict[str, DrawRecord] = {}
        """What the next flush writes: new draws, bound groups and decided fates."""

    def drawn(self, tasks: Sequence[Task], step: int) -> list[str]:
        """Register `tasks`, just handed out by the pool during loop step `step`, in draw order;
        their draw ids, in the same order."""
        first = self._counts.get(step, 0)
        self._counts[step] = first + len(tasks)
        ids = []
        for k, task in enumerate(tasks, first):
            rec = DrawRecord(draw_id(step, k), step, task.id, task.domain)
            self._open[rec.id] = self._dirty[rec.id] = rec
            ids.append(rec.id)
        return ids

    def reopen(self, rec: DrawRecord) -> None:
        """Open again a draw the trace holds with no fate (in flight at the checkpoint a resume
        started from), to be re-run: it keeps its id and gets its fate once, here; nothing is
        written until a new group is bound to it (`bind`)."""
        if rec.fate is not None:
            raise ValueError(f"draw {rec.id!r} has its fate already ({rec.fate}): it cannot be re-run")
        if rec.id in self._open:
            raise ValueError(f"draw {rec.id!r} is open already")
        self._open[rec.id] = DrawRecord(rec.id, rec.step, rec.task_id, rec.domain)

    def bind(self, draw: str, group_id: str) -> None:
        """The group `group_id` was made from the draw `draw`."""
        rec = self._record(draw)
        if rec.group_id not in (None, group_id):
            self._by_group.pop(rec.group_id, None)
        rec = DrawRecord(rec.id, rec.step, rec.task_id, rec.domain, group_id)
        self._open[draw] = self._dirty[draw] = rec
        self._by_group[group_id] = draw

    def draw_of(self, group_id: str) -> str | None:
        """The open draw the group `group_id` was made from (None: no such group)."""
        return self._by_group.get(group_id)

    def trained(self, draw: str, step: int) -> None:
        """The draw's group was trained on at loop step `step`."""
        self._decide(draw, "trained", "", step)

    def dropped(self, draw: str, reason: str, step: int) -> None:
        """The draw is dropped at loop step `step` for `reason` (a key of trace.DROP_REASONS, maybe
        followed by ': ' and a detail)."""
        if reason.split(":", 1)[0] not in DROP_REASONS:
            raise ValueError(f"drop reason {reason!r} is none of {sorted(DROP_REASONS)}")
        self._decide(draw, "dropped", reason, step)

    def stop(self, step: int) -> int:
        """Drop every open draw ("stopped": the run stops with them in flight); how many."""
        open_ = list(self._open)
        for draw in open_:
            self.dropped(draw, "stopped", step)
        return len(open_)

    def account(
        self,
        step: int,
        groups: Sequence[Sequence[Rollout]],
        kept: Sequence[Sequence[Rollout]],
        outcome: str,
        guard_reason: str | None = None,
        dynamic_sampling: bool = True,
    ) -> None:
        """Loop step `step`'s fates: each returned group's draw is trained when the group was kept
        and the step's train step applied its update (`outcome` "applied"); else dropped: "masked"
        (no sample scored), "filtered" (dynamic sampling on and the group uninformative), "stale"
        (left out for its weights' age), "guard" (the trainer's guard skipped or rolled back the
        update: `outcome` "skipped" or "rolled_back", with `guard_reason`), "no_signal" (any other
        outcome: the step had no row with signal, or trained nothing). RuntimeError for a group
        with no open draw (a pipeline path that never bound it). The loop then `flush`es."""
        kept_ids = {g[0].group_id for g in kept if g}
        for g in groups:
            draw = self.draw_of(g[0].group_id)
            if draw is None:  # a group the ledger never bound: a pipeline path that skips it
                raise RuntimeError(f"group {g[0].group_id} has no draw in the ledger")
            if all(r.reward is None for r in g):
                self.dropped(draw, "masked", step)
            elif g[0].group_id not in kept_ids:
                self.dropped(draw, "filtered" if dynamic_sampling and not informative(g) else "stale", step)
            elif outcome == "applied":
                self.trained(draw, step)
            elif outcome in ("skipped", "rolled_back"):
                self.dropped(draw, f"guard: {outcome} ({guard_reason})", step)
            else:
                self.dropped(draw, f"no_signal: {outcome}", step)

    def open(self) -> list[str]:
        """The ids of the draws with no fate yet, in draw order."""
        return list(self._open)

    def flush(self, trace: Any) -> None:
        """Write the draws and fates registered since the last flush (one transaction)."""
        if self._dirty:
            trace.record_draws(list(self._dirty.values()))
            self._dirty = {}

    def _record(self, draw: str) -> DrawRecord:
        rec = self._open.get(draw)
        if rec is None:
            raise ValueError(f"draw {draw!r} is not open (never drawn, or given its fate already)")
        return rec

    def _decide(self, draw: str, fate: str, reason: str, step: int) -> None:
        rec = self._record(draw)
        del self._open[draw]
        if rec.group_id is not None:
            self._by_group.pop(rec.group_id, None)
        self._dirty[draw] = DrawRecord(rec.id, rec.step, rec.task_id, rec.domain, rec.group_id, fate, reason, step)
