"""The hf engine's speculative decoding: the acceptance rule, acceptance counters and the auto-off rule.

Invariant: the acceptance rule (`accepted_lengths`) lets only the policy's own samples out; the
counters and the governor decide how many tokens are drafted and count what happened, never
which tokens are emitted.

The rule (`net_negative`): a verifying step of a batch costs `spec_s` seconds (drafting, the
(k+1)-token forward, acceptance) and emits `gain` tokens per unfinished row on average; a plain
step costs `plain_s` and emits 1. Speculation loses when gain / spec_s < 1 / plain_s, that is
when gain < spec_s / plain_s = 1 + overhead. `Governor` measures both per batch-size bucket
(rows rounded up to a power of two) as running means over the engine's own steps and turns
speculation off in a bucket where the rule holds; there it retries a speculative step every
`retry_every`-th step, so a bucket that turned positive (e.g. after the policy changed) comes
back on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from posttrain.errors import GenerationError


def accepted_lengths(sampled: torch.Tensor, drafted: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per row, how many drafted tokens are accepted: the length of the run of positions j where
    the draft's token `drafted[:, j]` is real (`valid[:, j]`) and equals `sampled[:, j]`, the token
    the row's own sampler draws from the policy after the tokens before it (rows x k each).

    For a deterministic drafter (q a point mass on the draft d) this is the standard
    speculative-sampling rule: d is accepted with probability P(sample = d) = p(d) = min(1, p/q),
    and after a rejection the emitted token is `sampled[:, j]` given that it is not d, which is
    the normalised residual max(0, p - q); greedy rows accept while the draft is the argmax."""
    matched = (sampled == drafted) & valid
    return matched.long().cumprod(dim=1).sum(dim=1)


def net_negative(gain: float, spec_s: float, plain_s: float) -> bool:
    """Whether speculation slows decoding down: `gain` (tokens emitted per row per verifying
    step) below `spec_s / plain_s` (a verifying step's time over a plain step's, 1 + overhead)."""
    if plain_s <= 0:
        return False
    return gain < spec_s / plain_s


@dataclass
class _Bucket:
    steps: int = 0
    spec_n: int = 0
    plain_n: int = 0
    spec_s: float = 0.0
    plain_s: float = 0.0
    gain: float = 0.0
    off: bool = False


class Governor:
    """Whether to speculate at a step of a batch of `rows` rows, by the measured rule above.
    Running means are exponential (weight `alpha` for a new step) after a first plain mean of
    `min_steps` steps; no decision before `min_steps` of each kind were measured (until then the
    two kinds take turns). While on, every `probe_every`-th step of a bucket is plain, so both
    kinds keep being measured."""

    def __init__(
        self, enabled: bool = True, min_steps: int = 8, probe_every: int = 16, retry_every: int = 64, alpha: float = 0.1
    ) -> None:
        self.enabled, self.min_steps, self.alpha = enabled, min_steps, alpha
        self.probe_every, self.retry_every = probe_every, retry_every
        self.buckets: dict[int, _Bucket] = {}

    @staticmethod
    def bucket(rows: int) -> int:
        """The bucket of a batch of `rows` rows: the smallest power of two >= rows."""
        return 1 << max(0, rows - 1).bit_length()

    def speculate(self, rows: int) -> bool:
        """Whether this step of a batch of `rows` rows drafts (counts the step)."""
        b = self.buckets.setdefault(self.bucket(rows), _Bucket())
        b.steps += 1
        if not self.enabled:
            return True
        if b.off:
            return b.steps % self.retry_every == 0
        if b.spec_n < self.min_steps or b.plain_n < self.min_steps:  # warming up: measure both in turn
            return b.spec_n <= b.plain_n
        return b.steps % self.probe_every != 0

    def record(self, rows: int, speculated: bool, seconds: float, gain: float = 1.0) -> None:
        """A step of `rows` rows took `seconds`; a speculative one emitted `gain` tokens per
        unfinished row."""
        b = self.buckets.setdefault(self.bucket(rows), _Bucket())
        if speculated:
            b.spec_n += 1
            b.spec_s = _mean(b.spec_s, seconds, b.spec_n, self.min_steps, self.alpha)
            b.gain = _mean(b.gain, gain, b.spec_n, self.min_steps, self.alpha)
        else:
            b.plain_n += 1
            b.plain_s = _mean(b.plain_s, seconds, b.plain_n, self.min_steps, self.alpha)
        if self.enabled and b.spec_n >= self.min_steps and b.plain_n >= self.min_steps:
            b.off = net_negative(b.gain, b.spec_s, b.plain_s)

    def off_buckets(self) -> list[int]:
        """The buckets where speculation is off now."""
        return sorted(k for k, b in self.buckets.items() if b.off)


def _mean(old: float, new: float, n: int, warm: int, alpha: float) -> float:
    """A plain mean over the first `warm` values, exponential after."""
    return old + (new - old) / n if n <= warm else old + alpha * (new - old)


@dataclass
class SpecCounters:
    """What speculation did since the engine was built."""

    depth: int
    forwards: int = 0
    """Verifying forwards (more than one token fed per row)."""
    rows: int = 0
    """Row-steps that verified a non-empty draft."""
    drafting: int = 0
    """Row-steps of unfinished rows at steps the governor let draft (a draft found or not)."""
    proposed: int = 0
    accepted: int = 0
    plain_steps: int = 0
    """Steps decoded one token per row inside speculative batches (no draft, a probe, or off)."""
    off_steps: int = 0
    """Steps the auto-off governor ran plain: its periodic probes, and the steps of a bucket it
    switched off (always 0 with auto_off false)."""
    proposed_at: list[int] = field(default_factory=list)
    """Per depth d (index d - 1): drafts with a d-th token."""
    accepted_at: list[int] = field(default_factory=list)
    """Per depth d: drafts whose d-th token was accepted."""

    def __post_init__(self) -> None:
        self.proposed_at = self.proposed_at or [0] * self.depth
        self.accepted_at = self.accepted_at or [0] * self.depth

    def add(self, proposed: int, accepted: int) -> None:
        """One row's verified draft: `proposed` tokens, the first `accepted` accepted."""
        self.rows += 1
        self.proposed += proposed
        self.accepted += accepted
        for d in range(proposed):
            self.proposed_at[d] += 1
        for d in range(accepted):
            self.accepted_at[d] += 1

    def counters(self) -> dict[str, int]:
        """Integer counters for the metrics row (prefixed `engine_` there)."""
        out = {
            "spec_forwards": self.forwards,
            "spec_rows": self.rows,
            "spec_drafting": self.drafting,
            "spec_proposed": self.proposed,
            "spec_accepted": self.accepted,
            "spec_plain_steps": self.plain_steps,
            "spec_off_steps": self.off_steps,
        }
        for d in range(self.depth):
            out[f"spec_proposed_d{d + 1}"] = self.proposed_at[d]
            out[f"spec_accepted_d{d + 1}"] = self.accepted_at[d]
        return out


def acceptance_row(now: dict[str, int], before: dict[str, int]) -> dict[str, float]:
    """Figures between two `counters()` snapshots (prefixed or not, the same keys): acceptance
    (accepted / proposed draft tokens) and mean accepted length (tokens emitted per verified
    draft: accepted + the one the policy adds), when a draft was verified between them;
    `spec_step_len`, tokens emitted per row per step at the steps that drafted (1.0: nothing
    drafted or accepted, as with a wiped drafter), when such steps ran; and `spec_acceptance_d{i}`,
    the share of drafts with an i-th token whose i-th token was accepted, for each depth i that
    drafted between them."""
    key = next((k for k in now if k.endswith("spec_rows")), None)
    if key is None:
        return {}
    pre = key[: -len("spec_rows")]

    def delta(name: str) -> int:
        return now.get(pre + name, 0) - before.get(pre + name, 0)

    rows, proposed, accepted, drafting = (
        delta("spec_rows"),
        delta("spec_proposed"),
        delta("spec_accepted"),
        delta("spec_drafting"),
    )
    out: dict[str, float] = {}
    if rows > 0 and proposed > 0:
        out[pre + "spec_acceptance"] = round(accepted / proposed, 4)
        out[pre + "spec_accepted_len"] = round(1 + accepted / rows, 4)
    if drafting > 0:
        out[pre + "spec_step_len"] = round(1 + accepted / drafting, 4)
    depth = 1
    while pre + f"spec_proposed_d{depth}" in now:  # acceptance at each depth: of drafts with a d-th token
        proposed_d = delta(f"spec_proposed_d{depth}")
        if proposed_d > 0:
            out[pre + f"spec_acceptance_d{depth}"] = round(delta(f"spec_accepted_d{depth}") / proposed_d, 4)
        depth += 1
    return out


PROBE_PROMPTS = 16
"""Prompts of the push probe (`HFEngine.spec_probe`): the first this many distinct ones generated for."""
PROBE_TOKENS = 32
"""Most tokens the push probe generates per prompt."""
PROBE_ROW_STEPS = 128
"""The drafting row-steps the push probe aims at: its first run keeps the fewest prompts that give
about this many (a 30% fall of a level of 1.5 is then 64 tokens short, 3 sd of noise are 24)."""
PROBE_SEED = 20_261_206
"""The push probe's request seed (greedy: no draw depends on it; fixed so none comes from the engine)."""


class CollapseProbe:
    """Fails loudly when speculation collapses: after `warmup` steps, a step whose `spec_step_len`
    (tokens per row per drafting step) is more than `drop` below the running level (an
    exponential mean, weight `alpha`, of the steps before it) raises GenerationError with both
    figures. A step that passes joins the level; a step without drafting steps is skipped.

    With `rows` (the drafting row-steps the figure was measured over) a fall must also be more
    than counting noise: the accepted tokens missing against the level, rows x (level - figure),
    more than 3 x sqrt(rows x (level - 1)), three standard deviations of a Poisson count of the
    accepted tokens the level expects. A probe of a few short answers (8 row-steps, a figure in
    steps of 1/8) cannot then stop a run by chance; a wiped drafter over some dozens can."""

    def __init__(self, drop: float = 0.3, warmup: int = 3, alpha: float = 0.3) -> None:
        if not 0 < drop < 1:
            raise ValueError(f"CollapseProbe drop must be in (0, 1), got {drop}")
        self.drop, self.warmup, self.alpha = drop, warmup, alpha
        self.level: float | None = None
        self.seen = 0

    def observe(self, step_len: float | None, where: str = "", rows: int | None = None) -> None:
        """One step's figure (None: no drafting step ran) over `rows` drafting row-steps (None:
        not known, the fall alone decides); raises on a collapse."""
        if step_len is None:
            return
        level = self.level
        fell = level is not None and self.seen >= self.warmup and step_len < (1 - self.drop) * level
        if fell and level is not None and rows is not None:  # and more than counting noise
            fell = rows * (level - step_len) > 3 * math.sqrt(rows * max(level - 1, 0.0))
        if fell:
            over = f" over {rows} drafting row-steps" if rows is not None else ""
            raise GenerationError(
                f"speculation collapsed{where}: {step_len:.3f} tokens per row per drafting step{over}, more than "
                f"{self.drop:.0%} below its running level {level:.3f} (a wiped, stale or broken drafter); "
                "engine.speculation.collapse_check false runs on without this check"
            )
        self.seen += 1
        self.level = step_len if self.level is None else self.level + self.alpha * (step_len - self.level)
