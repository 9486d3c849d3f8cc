"""The RL trainer: one `step(batch)` is one guarded AdamW update of the shared model.

Invariant: `step` either applies exactly one optimizer update computed from
the whole batch (micro-batches accumulate to the same gradient as one full
batch), or applies none and says why in its StepStats (no signal, skipped
by the guard, or rolled back to the last good state). The model is updated
in place, so an inference engine holding the same module sees the new
weights; it runs on whatever device the model's parameters are on.
The scale options (LoRA, FSDP, bf16 autocast, gradient checkpointing,
memory-sized micro-batches, pinned RNG; see prepare.py) and the long-context
ones (the LM head in chunks, chunked.py; rows packed without padding,
`pack_sequence`) change the model it trains and how a step is cut, never
what a step computes (up to float rounding).
"""

from __future__ import annotations

import copy
import inspect
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from posttrain.configs.trainer import TrainerConfig
from posttrain.errors import ConfigError, TrainerError
from posttrain.trainer.batch import RolloutLink, TrainBatch, TrainRow
from posttrain.trainer.checkpoint import load_checkpoint, save_checkpoint, seed_everything
from posttrain.trainer.chunked import chunk_positions, token_logp_entropy
from posttrain.trainer.fsdp import DataParallel
from posttrain.trainer.guard import SpikeGuard
from posttrain.trainer.losses import (
    BatchTotals,
    LossInputs,
    LossStats,
    MismatchStats,
    build_loss,
    mismatch,
)
from posttrain.trainer.memory import autocast, bytes_per_token, micro_slices, release_freed_memory, token_budget
from posttrain.trainer.prepare import prepare_model

Outcome = Literal["applied", "coasted", "no_signal", "skipped", "rolled_back"]

_AUTO_CPU_MEMORY_SHARE = 0.25
"""Share of the CPU's available memory an automatic micro-batch may plan to use (the
engine, the sandbox and other processes share it)."""
DRAFT_OPTIMIZER = "draft_head_optimizer.pt"
"""The draft head's optimizer state in a checkpoint (trainer.draft_head)."""
_PASS_COST_TOKENS = 128
"""The fixed cost of one forward/backward pass, in padded tokens, for `cost_slices`:
a new micro-batch pays off when it saves more padding than this."""


@dataclass(frozen=True)
class StepStats:
    """What one `Trainer.step` did. Token-level figures cover contributing rows only."""

    step: int
    outcome: Outcome
    guard_reason: str
    loss: float
    grad_norm: float
    lr: float
    n_rows: int
    n_groups: int
    zero_adv_groups: int
    n_sequences: int
    n_tokens: int
    adv_mean: float
    adv_std: float
    clip_frac: float
    ratio_mean: float
    ratio_max: float
    kl: float
    entropy: float
    skipped_total: int
    rolled_back_total: int
    seconds: float
    mismatch_abs_mean: float = 0.0
    """Train-inference mismatch over the loss tokens, d = trainer's log-prob before the update
    minus the behaviour log-prob: mean |d| ..."""
    mismatch_abs_max: float = 0.0
    """... max |d| ..."""
    mismatch_k3: float = 0.0
    """... mean exp(d) - d - 1 (estimates KL(behaviour || trainer)) ..."""
    mismatch_outside: float = 0.0
    """... share of tokens whose ratio exp(d) lies outside [1/bound, bound] (trainer.mismatch.bound) ..."""
    mismatch_corrected: float = 0.0
    """... and share of tokens whose weight trainer.mismatch.correction changed (truncated or masked)."""
    entropy_bonus: float = 0.0
    """The entropy term subtracted from the loss (trainer.entropy_bonus): the sum over loss tokens of
    each row's coefficient x the policy's token entropy, over the step's loss tokens (0: no bonus)."""
    draft_acc: tuple[float, ...] = ()
    """trainer.draft_head: the head's accuracy at each depth on this step's loss tokens, before its
    update (teacher-forced: its argmax against the policy's sampled token); empty when no head
    or no fit ran."""
    rollouts: Mapping[str, RolloutLink] = field(default_factory=dict)
    """Rollout id -> advantage, ratio and clipped share of every batch row that carries
    a rollout id (the trace and the monitor read these: computed once, here)."""

    @property
    def weights_changed(self) -> bool:
        """True when the model's parameters may differ from before the step."""
        return self.outcome in ("applied", "coasted", "rolled_back")


@dataclass(frozen=True)
class _Prepared:
    """The rows that carry signal, with their advantages and step totals."""

    rows: tuple[TrainRow, ...]
    advantage_b: Tensor
    totals: BatchTotals
    """The loss's normalisers (trainer.normalise says what they count)."""
    n_tokens: int
    """Loss tokens of the rows that enter the loss."""
    n_groups: int
    zero_adv_groups: int
    batch_advantage_b: Tensor
    """The advantage of every row of the batch, in batch order (float32, as the loss sees it)."""


@dataclass(frozen=True)
class _Packed:
    """A micro-batch as tensors: right-padded prompt+completion and
    completion-aligned targets (position c of row b is completion token c),
    plus the loss tokens flattened (n: every token with mask 1, row-major)."""

    input_ids_bs: Tensor
    attention_bs: Tensor
    index_bc: Tensor
    target_bc: Tensor
    mask_bc: Tensor
    behaviour_bc: Tensor
    temperature_b: Tensor
    first_index: int
    row_n: Tensor
    """Row of each loss token."""
    col_n: Tensor
    """Completion position of each loss token."""
    pos_n: Tensor
    """Sequence position whose logits predict each loss token (prompt length - 1 + c)."""
    target_n: Tensor
    """Each loss token's id."""
    shared: _SharedPrompts | None = None
    """The micro-batch's distinct prompts, when forwarding each once is cheaper (`pack_rows`'s
    `share`); None: every row forwards its whole sequence."""
    position_bs: Tensor | None = None
    """With the rows packed into one sequence (`pack_sequence`): each token's position within
    its own row (restarting at 0 per row, so attention does not cross rows); None: right-padded
    rows under `attention_bs`."""
    seq_n: Tensor | None = None
    """With packing: the sequence (0) holding each loss token; None: its row (`row_n`)."""
    pixels: Tensor | None = None
    """A vision model's pixel values of the rows' images, row by row (`Trainer._with_pixels`)."""

    def decoder_inputs(self) -> dict[str, Any]:
        """The decoder's inputs: padded rows with their attention mask, or one packed sequence
        with per-row position ids, no mask and no cache (transformers then masks attention per
        row: it reads packed rows from the position ids only without a mask or a cache); with
        images, their pixel values."""
        extra = {} if self.pixels is None else {"pixel_values": self.pixels}
        if self.position_bs is not None:
            return {"input_ids": self.input_ids_bs, "position_ids": self.position_bs, "use_cache": False} | extra
        return {"input_ids": self.input_ids_bs, "attention_mask": self.attention_bs} | extra

    @property
    def sequence_n(self) -> Tensor:
        """The sequence of the forward that holds each loss token."""
        return self.seq_n if self.seq_n is not None else self.row_n


@dataclass(frozen=True)
class _SharedPrompts:
    """A micro-batch as its distinct prompts (each forwarded once) and each row's completion,
    which then attends to its prompt's keys and values (copied per row, so the gradient of
    every row reaches the prompt's one forward). Completion position c of a row is predicted
    by its prompt's last position (c = 0) or by completion position c - 1."""

    prompt_ids_us: Tensor
    """The distinct prompts, right-padded (u: distinct prompt, s: position)."""
    prompt_mask_us: Tensor
    last_u: Tensor
    """Position of each prompt's last token."""
    prompt_b: Tensor
    """Each row's prompt (an index into u)."""
    input_ids_bc: Tensor
    """Each row's completion tokens but the last (the inputs that predict tokens 1..), right-padded."""
    mask_bc: Tensor
    position_bc: Tensor
    """Sequence position of each completion input (prompt length + c)."""


@dataclass(frozen=True)
class _Accumulated:
    loss: float
    stats: LossStats
    entropy_sum: float
    mismatch: MismatchStats = MismatchStats()
    bonus: float = 0.0
    """The entropy-bonus term subtracted from the loss (already in `loss`)."""


class Trainer:
    """Owns the optimizer of a causal LM and applies guarded policy-gradient steps."""

    def __init__(self, model: Any, config: TrainerConfig, ref_model: Any = None, processor: Any = None) -> None:
        if config.kl_coef > 0.0 and ref_model is None:
            raise ConfigError("trainer.kl_coef > 0 needs a reference model (ref_model is None)")
        if config.kl_coef == 0.0 and ref_model is not None:
            raise ConfigError("trainer.kl_coef is 0, so no reference model should be loaded (ref_model given)")
        seed_everything(config.seed)
        model = prepare_model(model, config)
        self.parallel = DataParallel.current() if config.fsdp else DataParallel()
        self.model = model
        self.ref_model = ref_model
        self.config = config
        self.loss = build_loss(config.loss, config.kl_coef)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise TrainerError("the model has no trainable parameters")
        # foreach: one kernel per op over every parameter instead of a Python loop over them
        # (the same arithmetic, bit for bit; torch picks the per-tensor loop on CPU by default)
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay, foreach=True
        )
        self.guard = SpikeGuard(config.guard)
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.steps = 0
        self.skipped = 0
        self.rolled_back = 0
        self._loss_tokens = 1
        """During `step`: the loss tokens of the rows that enter the loss (the entropy bonus's normaliser)."""
        self._row_clip: dict[str, tuple[float, float]] = {}
        """During `step`: rollout id -> (mean ratio, clipped token share) of each row with a
        rollout id that entered this rank's loss; reported in StepStats.rollouts."""
        self._snapshot: tuple[list[Tensor], dict[str, Any]] | None = None
        self._ref_head: tuple[Any, Any] | bool | None = None
        self._take_snapshot()
        self.processor = processor
        """A vision model's processor: the trainer recomputes each row's pixels with it."""
        self._image_id, self._image_run = _image_tokens(model)
        if self._image_id is not None and processor is None:
            raise ConfigError("a vision model's trainer needs its processor (Trainer(..., processor=...))")
        if self._image_id is not None and config.packing_tokens is not None:
            raise ConfigError("trainer.packing_tokens: a vision model trains on padded rows; leave it null")
        self._pixel_cache: dict[tuple[str, ...], Tensor] = {}
        """Pixel values of the images of the batch being checked, by the images' sha256s."""
        self._split_head = split_head(model) if not config.fsdp and self._image_id is None else None
        """(decoder, lm_head) when the model's logits are exactly lm_head(decoder output): the
        step then sends only loss positions through the head (None: the model's own forward,
        always for a vision model, whose forward takes the pixels)."""
        if config.packing_tokens is not None and not packs_rows(model):
            raise ConfigError(
                "trainer.packing_tokens: this model attends across rows packed into one sequence "
                "(its logits differ from the padded rows'); leave packing_tokens null"
            )
        self._chunk = chunk_positions(config.logits_chunk_mib, self.vocab_size)
        """Loss positions per LM-head chunk (trainer.logits_chunk_mib; None: all at once)."""
        self._max_tokens = self._token_budget()
        self._share_prompts = (
            self._split_head is not None
            and not config.gradient_checkpointing
            and shares_prompts(model, self._split_head)
        )
        """Whether a micro-batch whose rows share prompts may forward each prompt once
        (`_SharedPrompts`): the decoder takes a key/value cache and gives the same logits."""
        self.draft_head, self._draft_opt = self._make_draft_head()
        """trainer.draft_head: the co-trained head and its own optimizer (None, None: off)."""
        self._draft_fit: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
        """During a micro-step with the head on: (hidden, target, row, col) of its loss tokens."""
        self.draft_acc: list[float] = []
        """The head's accuracy per depth on the last step's loss tokens, before its update (the
        mean over the step's micro-batches; empty: no fit ran)."""
        self._draft_accs: list[list[float]] = []
        self._draft_kept: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        """trainer.draft_head.passes > 1: each micro-batch's fit inputs (detached), for the head-only passes."""

    def _make_draft_head(self) -> tuple[Any, Any]:
        cfg = self.config.draft_head
        if not cfg.enabled:
            return None, None
        if self._split_head is None:
            raise ConfigError(
                "trainer.draft_head: the head reads the policy's last hidden state, which this model "
                "(or fsdp) does not expose apart from its logits; set trainer.draft_head.enabled false"
            )
        from posttrain.model.draft_head import DraftHead

        inner = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        eps = float(getattr(inner.config, "rms_norm_eps", 1e-6))
        head = DraftHead(int(inner.config.hidden_size), cfg.depth, eps, seed=self.config.seed, vocab_top=cfg.vocab)
        head = head.to(self.device, dtype=self.params[0].dtype)
        return head, torch.optim.AdamW(head.parameters(), lr=cfg.lr, foreach=True)

    @property
    def device(self) -> torch.device:
        return self.params[0].device

    def _token_budget(self) -> int | None:
        """Padded tokens per micro-batch: micro_batch_tokens when set; with an automatic
        micro-batch size, a budget from available memory (CUDA or CPU); else none."""
        cfg = self.config
        chunked = self._split_head is not None and self._chunk is not None  # logits memory bounded per chunk
        if cfg.micro_batch_tokens is not None or cfg.micro_batch_size != "auto":
            return token_budget(cfg.micro_batch_tokens, self.model, self.device, cfg.gradient_checkpointing, chunked)
        if self.device.type == "cuda":
            return token_budget("auto", self.model, self.device, cfg.gradient_checkpointing, chunked)
        if not all(hasattr(getattr(self.model, "config", None), k) for k in ("vocab_size", "hidden_size")):
            return None  # no sizes to estimate from: the whole step in one pass
        per_token = bytes_per_token(self.model, cfg.gradient_checkpointing, chunked)
        return max(1, int(available_memory_bytes() * _AUTO_CPU_MEMORY_SHARE / per_token))

    # ------------------------------------------------------------ the step

    def step(self, batch: TrainBatch) -> StepStats:
        """One optimizer step on `batch` (or none, with the reason in the stats)."""
        started = time.perf_counter()
        self._check_ids(batch)
        self.steps += 1
        prepared = self._prepare(batch)
        self._row_clip = {}
        if not prepared.rows:
            if self.config.coast:
                self._coast()
            return self._stats(batch, prepared, "coasted" if self.config.coast else "no_signal", "", None, 0.0, started)
        try:
            acc = self._accumulate(prepared)
        except BaseException:
            self.optimizer.zero_grad(set_to_none=True)  # no half-accumulated gradient survives
            if self._draft_opt is not None:
                self._draft_opt.zero_grad(set_to_none=True)
                self._draft_kept = []
            raise
        self._step_draft_head()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.config.grad_clip, foreach=True))
        reason = self.guard.verdict(acc.loss, grad_norm)
        outcome = self._apply(reason, acc.loss, grad_norm)
        release_freed_memory(self.device)  # the step's activations, freed, leave the process (glibc keeps them)
        return self._stats(batch, prepared, outcome, reason, acc, grad_norm, started)

    def _step_draft_head(self) -> None:
        """The draft head's own optimizer step on the gradient its loss left (summed over the
        micro-batches), whatever the policy's step does: the head only fits the rollouts."""
        if self._draft_opt is None or self.draft_head is None:
            return
        accs, self._draft_accs = self._draft_accs, []
        self.draft_acc = [
            sum(a[d] for a in accs if len(a) > d) / sum(1 for a in accs if len(a) > d)
            for d in range(max((len(a) for a in accs), default=0))
        ]
        params = list(self.draft_head.parameters())
        torch.nn.utils.clip_grad_norm_(params, self.config.draft_head.grad_clip)
        self._draft_opt.step()
        self._draft_opt.zero_grad(set_to_none=True)
        kept, self._draft_kept = self._draft_kept, []
        if not kept:
            return
        from posttrain.model.draft_head import policy_tables

        embed_vh, lm_vh = policy_tables(self.model)
        for _ in range(self.config.draft_head.passes - 1):  # trainer.draft_head.passes: head-only passes
            for fit in kept:
                loss, _ = self.draft_head.fit_loss(*fit, embed_vh, lm_vh, count=False)
                if loss.requires_grad:
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(params, self.config.draft_head.grad_clip)
                    self._draft_opt.step()
                    self._draft_opt.zero_grad(set_to_none=True)

    def _apply(self, reason: str, loss: float, grad_norm: float) -> Outcome:
        if reason:
            self.optimizer.zero_grad(set_to_none=True)
            if self.config.guard.action == "rollback":
                self._restore_snapshot()
                self.rolled_back += 1
                return "rolled_back"
            self.skipped += 1
            return "skipped"
        self._take_snapshot()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.guard.accept(loss, grad_norm)
        return "applied"

    def _coast(self) -> None:
        """The optimizer step of a zero gradient (trainer.coast: a step whose sampled groups carry
        no signal): Adam's moments decay and carry the update on, weight decay applies, the step
        counter advances, exactly as torch's AdamW does with zero gradients. Nothing for the
        guard to judge; the snapshot is taken as before any update."""
        self._take_snapshot()
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # ------------------------------------------------------------ advantages and filtering

    def _check_ids(self, batch: TrainBatch) -> None:
        for i, row in enumerate(batch.rows):
            for name in ("prompt_ids", "completion_ids"):
                ids = getattr(row, name)
                if ids and not (min(ids) >= 0 and max(ids) < self.vocab_size):
                    raise TrainerError(f"rows[{i}].{name} holds token ids outside [0, {self.vocab_size})")
        self._check_pixels(batch.rows)

    def _check_pixels(self, rows: Sequence[TrainRow]) -> None:
        """Every row's images against its sequence and the generator: a text model takes none; a
        vision model's row has one run of image tokens per image (in its prompt, and in a
        multi-turn episode's observations within its completion), and the pixels recomputed from
        its images (`model.vision.pixel_values`) have the digest the generator reported. Keeps
        the pixels for the step's forwards (`_with_pixels`); TrainerError naming the row else."""
        from posttrain.model.vision import pixel_digest, pixel_values

        self._pixel_cache = {}
        for i, row in enumerate(rows):
            if self._image_id is None:
                if row.images:
                    raise TrainerError(f"rows[{i}] carries {len(row.images)} image(s) but the model reads text only")
                continue
            found = sum(1 for t in (*row.prompt_ids, *row.completion_ids) if t == self._image_id)
            if found != self._image_run * len(row.images):
                raise TrainerError(
                    f"rows[{i}] has {found} image tokens for {len(row.images)} image(s) of {self._image_run} "
                    "tokens each: an image was lost between the rollout and the batch"
                )
            if not row.images:
                continue
            key = tuple(im.sha256 for im in row.images)
            pixels = self._pixel_cache.get(key)
            if pixels is None:
                pixels = self._pixel_cache[key] = pixel_values(self.processor, row.images)
            if row.pixel_digest and pixel_digest(pixels) != row.pixel_digest:
                raise TrainerError(
                    f"rows[{i}]: the pixels of its images differ from those the generator saw (digest "
                    f"{pixel_digest(pixels)[:16]}..., generator {row.pixel_digest[:16]}...): an image was altered"
                )

    def _with_pixels(self, rows: Sequence[TrainRow], packed: _Packed) -> _Packed:
        """`packed` with the rows' pixel values (checked by `_check_pixels`), row by row."""
        if self._image_id is None or not any(r.images for r in rows):
            return packed
        pixels = [self._pixel_cache[tuple(im.sha256 for im in r.images)] for r in rows if r.images]
        return replace(packed, pixels=torch.cat(pixels).to(self.device, self.model.dtype))

    def _prepare(self, batch: TrainBatch) -> _Prepared:
        if not batch.rows:  # every group of the step was filtered before the trainer
            empty = torch.zeros(0, dtype=torch.float32)
            totals = BatchTotals(n_sequences=batch.filtered_rows, n_tokens=batch.filtered_tokens)
            return _Prepared((), empty, totals, n_tokens=0, n_groups=0, zero_adv_groups=0, batch_advantage_b=empty)
        group_index: dict[Any, int] = {}
        group_b = torch.tensor([group_index.setdefault(r.group_id, len(group_index)) for r in batch.rows])
        reward_b = torch.tensor([r.reward for r in batch.rows], dtype=torch.float64)
        exact_b = self.loss.advantages(reward_b, group_b)  # the one advantage computation of a step
        for i, r in enumerate(batch.rows):  # a row judged against a baseline, not its group (TrainRow.baseline)
            if r.baseline is not None:
                exact_b[i] = r.reward - r.baseline
        advantage_b = exact_b.to(torch.float32)  # as the loss, the trace and the monitor see it
        nonzero_b = (exact_b != 0).long()
        signal_g = torch.zeros(len(group_index), dtype=torch.long).index_add_(0, group_b, nonzero_b) > 0
        # a row with an entropy bonus enters the loss for its entropy term even without signal
        keep = [
            i
            for i, r in enumerate(batch.rows)
            if (signal_g[group_b[i]] or r.entropy_coef > 0.0) and r.n_loss_tokens > 0
        ]
        if self.config.sort_by_length:  # similar lengths share a micro-batch: less padding
            keep.sort(key=lambda i: _order_key(batch.rows[i]))
        rows = tuple(batch.rows[i] for i in keep)
        n_tokens = sum(r.n_loss_tokens for r in rows)
        if self.config.normalise == "sampled":  # zero-gradient rows count: filtering only saves compute
            totals = BatchTotals(
                n_sequences=len(batch.rows) + batch.filtered_rows,
                n_tokens=sum(r.n_loss_tokens for r in batch.rows) + batch.filtered_tokens,
            )
        else:
            totals = BatchTotals(n_sequences=len(rows), n_tokens=n_tokens)
        return _Prepared(
            rows=rows,
            advantage_b=advantage_b[keep],
            totals=totals,
            n_tokens=n_tokens,
            n_groups=len(group_index),
            zero_adv_groups=int((~signal_g).sum()),
            batch_advantage_b=advantage_b,
        )

    # ------------------------------------------------------------ forward/backward

    def _accumulate(self, prepared: _Prepared) -> _Accumulated:
        was_training = self.model.training
        # no dropout: on-policy ratios are exactly exp(0) = 1. Gradient checkpointing acts
        # only in train mode, so with it the model trains in train mode, its dropout set to 0.
        self.model.train(self.config.gradient_checkpointing)
        loss, stats, entropy_sum, gap, bonus = 0.0, LossStats(), 0.0, MismatchStats(), 0.0
        self._loss_tokens = prepared.n_tokens  # the entropy bonus's normaliser
        try:
            for rows, advantage_b, weight in self._micro_batches(prepared):
                mb_loss, mb_stats, mb_entropy, mb_gap, mb_bonus = self._micro_step(
                    rows, advantage_b, prepared.totals, weight
                )
                if weight:
                    loss, stats, entropy_sum = loss + mb_loss, stats.merge(mb_stats), entropy_sum + mb_entropy
                    gap, bonus = gap.merge(mb_gap), bonus + mb_bonus
        finally:
            self.model.train(was_training)
        return self._reduce(_Accumulated(loss=loss, stats=stats, entropy_sum=entropy_sum, mismatch=gap, bonus=bonus))

    def _micro_batches(self, prepared: _Prepared) -> list[tuple[Sequence[TrainRow], Tensor, float]]:
        """This rank's rows cut into micro-batches; with FSDP, zero-weighted padding
        micro-batches so that every rank runs as many forward/backward passes."""
        lo, hi = self.parallel.share(len(prepared.rows))
        lengths = [len(r.prompt_ids) + len(r.completion_ids) for r in prepared.rows[lo:hi]]
        if self.config.packing_tokens is not None:
            bins = [[lo + i for i in b] for b in pack_bins(lengths, self.config.packing_tokens)]
            batches = [(tuple(prepared.rows[i] for i in b), prepared.advantage_b[b], 1.0) for b in bins]
            for _ in range(self.parallel.max_int(len(bins)) - len(bins)):
                batches.append((prepared.rows[:1], torch.zeros(1), 0.0))
            return batches
        if self.config.micro_batch_size == "auto":
            prompts = [r.prompt_ids for r in prepared.rows[lo:hi]] if self._share_prompts else None
            slices = cost_slices(lengths, self._max_tokens, prompts)
        else:
            slices = micro_slices(lengths, self.config.micro_batch_size, self._max_tokens)
        cuts = [(lo + a, lo + b) for a, b in slices]
        batches = [(prepared.rows[a:b], prepared.advantage_b[a:b], 1.0) for a, b in cuts]
        for _ in range(self.parallel.max_int(len(cuts)) - len(cuts)):
            batches.append((prepared.rows[:1], torch.zeros(1), 0.0))
        return batches

    def _reduce(self, acc: _Accumulated) -> _Accumulated:
        """Sum loss and stats over the data-parallel ranks (identity on one process)."""
        if not self.parallel.active:
            return acc
        s, g = acc.stats, acc.mismatch
        sums = self.parallel.sum_floats(
            [acc.loss, acc.entropy_sum, s.n_tokens, s.clipped_low, s.clipped_high, s.ratio_sum, s.kl_sum]
            + [g.n_tokens, g.abs_sum, g.k3_sum, g.outside, g.corrected, acc.bonus]
        )
        stats = LossStats(
            n_tokens=sums[2],
            clipped_low=sums[3],
            clipped_high=sums[4],
            ratio_sum=sums[5],
            ratio_max=self.parallel.max_float(s.ratio_max),
            kl_sum=sums[6],
        )
        gap = MismatchStats(sums[7], sums[8], self.parallel.max_float(g.abs_max), sums[9], sums[10], sums[11])
        return _Accumulated(loss=sums[0], stats=stats, entropy_sum=sums[1], mismatch=gap, bonus=sums[12])

    def _micro_step(
        self, rows: Sequence[TrainRow], advantage_b: Tensor, totals: BatchTotals, weight: float = 1.0
    ) -> tuple[float, LossStats, float, MismatchStats, float]:
        if self.config.packing_tokens is not None:
            packed = pack_sequence(rows, self.device)
        else:
            packed = pack_rows(rows, self.device, share=self._share_prompts)
        packed = self._with_pixels(rows, packed)
        with_bonus = any(r.entropy_coef > 0.0 for r in rows)
        logp_n, entropy_n = self._loss_token_logp(
            self.model, self._split_head, packed, entropy_grad=with_bonus, keep_hidden=self.draft_head is not None
        )
        bonus, entropy_sum = entropy_term(entropy_n, rows, packed.row_n, self._loss_tokens)
        logp_bc = torch.zeros_like(packed.behaviour_bc).index_put((packed.row_n, packed.col_n), logp_n)
        mm = self.config.mismatch  # the trainer's log-probs here are the policy before this step's update
        with torch.no_grad():
            gap, factor_bc = mismatch(logp_bc, packed.behaviour_bc, packed.mask_bc, mm.correction, mm.bound)
        inputs = LossInputs(
            logp_bt=logp_bc,
            behaviour_logp_bt=packed.behaviour_bc,
            mask_bt=packed.mask_bc,
            advantage_b=advantage_b.to(self.device),
            ref_logp_bt=self._ref_logp(packed),
            old_logp_bt=logp_bc.detach() if factor_bc is not None else None,
            correction_bt=factor_bc,
        )
        loss, stats = self.loss(inputs, totals)
        if bonus is not None:  # trainer.entropy_bonus: the same term whatever the loss class
            loss = loss - bonus
        if weight:
            self._record_rows(rows, inputs)
        # FSDP averages gradients over ranks; each rank's loss is its share of the sum, so scale by world
        total = loss * (weight * self.parallel.world)
        if self._draft_fit is not None and weight:  # trainer.draft_head: its own loss, on detached inputs
            total = total + self._draft_loss()
        total.backward()
        return float(loss.detach()), stats, entropy_sum, gap, float(bonus.detach()) if bonus is not None else 0.0

    def _draft_loss(self) -> Tensor:
        """The draft head's loss on this micro-batch's loss tokens (model/draft_head.py); the
        policy's hidden states, embeddings and LM head enter it detached, so its gradient
        reaches only the head's parameters and the policy's update is the same without it."""
        assert self.draft_head is not None and self._draft_fit is not None
        from posttrain.model.draft_head import policy_tables

        hidden_nh, target_n, row_n, col_n = self._draft_fit
        self._draft_fit = None
        embed_vh, lm_vh = policy_tables(self.model)
        loss, acc = self.draft_head.fit_loss(hidden_nh.detach(), target_n, row_n, col_n, embed_vh, lm_vh)
        self._draft_accs.append(acc)
        if self.config.draft_head.passes > 1:  # kept for the head-only passes after the step
            self._draft_kept.append((hidden_nh.detach(), target_n, row_n, col_n))
        return loss

    def _record_rows(self, rows: Sequence[TrainRow], inputs: LossInputs) -> None:
        ratio_b, clipped_b = self.loss.row_stats(inputs)
        for row, ratio, clipped in zip(rows, ratio_b.tolist(), clipped_b.tolist()):
            if row.rollout_id:  # unique in a batch (_check_ids); a row without one is reported nowhere
                self._row_clip[row.rollout_id] = (ratio, clipped)

    def _links(self, batch: TrainBatch, prepared: _Prepared) -> dict[str, RolloutLink]:
        """Each row's advantage (as the loss used it) and clip figures, by its rollout id."""
        out = {}
        for row, adv in zip(batch.rows, prepared.batch_advantage_b.tolist()):
            if row.rollout_id:
                ratio, clipped = self._row_clip.get(row.rollout_id, (None, None))
                out[row.rollout_id] = RolloutLink(float(adv), ratio, clipped)
        return out

    def _ref_logp(self, packed: _Packed) -> Tensor | None:
        if self.ref_model is None:
            return None
        if self._ref_head is None:
            self._ref_head = split_head(self.ref_model) or False
        ref_device = next(self.ref_model.parameters()).device
        on_ref = _to_device(replace(packed, shared=None), ref_device)
        with torch.no_grad():
            logp_n = self._loss_token_logp(self.ref_model, self._ref_head or None, on_ref)[0].to(self.device)
        return torch.zeros_like(packed.behaviour_bc).index_put((packed.row_n, packed.col_n), logp_n)

    def _loss_token_logp(
        self,
        model: Any,
        head: tuple[Any, Any] | None,
        packed: _Packed,
        entropy_grad: bool = False,
        keep_hidden: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """`loss_token_logp` with this trainer's chunk and precision; `keep_hidden` (the draft
        head on) keeps the loss positions' hidden states for `_draft_loss`."""
        logp_n, entropy_n, hidden_nh = loss_token_logp(
            model, head, packed, self._chunk, self.config.precision, entropy_grad
        )
        if keep_hidden:
            self._draft_fit = (hidden_nh, packed.target_n, packed.row_n, packed.col_n)
        return logp_n, entropy_n

    def token_logprobs(self, rows: Sequence[TrainRow]) -> list[tuple[float, ...]]:
        """Each row's log-probs of its loss tokens (mask 1) under the current weights, by the
        forward the loss takes: log_softmax(logits / temperature), temperature 0 scored at 1.
        No gradient, eval mode, nothing of the optimizer or the RNG touched: what an engine
        serving these weights should report for the same tokens (engine/probe.py)."""
        if not rows:
            return []
        was_training = self.model.training
        self.model.eval()
        try:
            self._check_pixels(rows)
            with torch.no_grad():
                packed = self._with_pixels(rows, pack_rows(rows, self.device, share=self._share_prompts))
                values = self._loss_token_logp(self.model, self._split_head, packed)[0].tolist()
        finally:
            self.model.train(was_training)
        out, start = [], 0
        for row in rows:
            out.append(tuple(values[start : start + row.n_loss_tokens]))
            start += row.n_loss_tokens
        return out

    def sequence_logprobs(
        self, prompt_ids: Sequence[int], token_ids: Sequence[int], temperature: float
    ) -> tuple[float, ...]:
        """`token_logprobs` of one sequence: the log-probs of `token_ids` after `prompt_ids`."""
        return self.token_logprobs([TrainRow.scoring(prompt_ids, token_ids, temperature)])[0]

    # ------------------------------------------------------------ rollback

    def _take_snapshot(self) -> None:
        if self.config.guard.action != "rollback":
            return
        with torch.no_grad():
            params = [p.detach().clone() for p in self.params]
        self._snapshot = (params, copy.deepcopy(self.optimizer.state_dict()))

    def _restore_snapshot(self) -> None:
        if self._snapshot is None:
            raise TrainerError("rollback requested but no good state was recorded")
        params, optim_state = self._snapshot
        with torch.no_grad():
            for p, saved in zip(self.params, params):
                p.copy_(saved)
        self.optimizer.load_state_dict(copy.deepcopy(optim_state))

    # ------------------------------------------------------------ stats

    def _stats(
        self,
        batch: TrainBatch,
        prepared: _Prepared,
        outcome: Outcome,
        reason: str,
        acc: _Accumulated | None,
        grad_norm: float,
        started: float,
    ) -> StepStats:
        stats = acc.stats if acc is not None else LossStats()
        gap = (acc.mismatch if acc is not None else MismatchStats()).per_token()
        adv_b = prepared.advantage_b
        return StepStats(
            step=self.steps,
            outcome=outcome,
            guard_reason=reason,
            loss=acc.loss if acc is not None else 0.0,
            grad_norm=grad_norm,
            lr=self.optimizer.param_groups[0]["lr"],
            n_rows=len(batch.rows),
            n_groups=prepared.n_groups,
            zero_adv_groups=prepared.zero_adv_groups,
            n_sequences=len(prepared.rows),
            n_tokens=prepared.n_tokens,
            adv_mean=float(adv_b.mean()) if adv_b.numel() else 0.0,
            adv_std=float(adv_b.std(unbiased=False)) if adv_b.numel() else 0.0,
            clip_frac=stats.clip_frac,
            ratio_mean=stats.ratio_mean,
            ratio_max=stats.ratio_max,
            kl=stats.kl_mean,
            entropy=acc.entropy_sum / stats.n_tokens if acc is not None and stats.n_tokens else 0.0,
            skipped_total=self.skipped,
            rolled_back_total=self.rolled_back,
            seconds=time.perf_counter() - started,
            **gap,
            entropy_bonus=acc.bonus if acc is not None else 0.0,
            draft_acc=tuple(round(a, 4) for a in self.draft_acc) if acc is not None else (),
            rollouts=self._links(batch, prepared),
        )

    # ------------------------------------------------------------ state and checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The trainer's own JSON state (counters and guard history)."""
        return {
            "steps": self.steps,
            "skipped": self.skipped,
            "rolled_back": self.rolled_back,
            "guard": self.guard.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self.skipped = int(state["skipped"])
        self.rolled_back = int(state["rolled_back"])
        self.guard.load_state_dict(state["guard"])

    def save(
        self, run_dir: str | Path, tokenizer: Any, loop_state: dict[str, Any] | None = None, step: int | None = None
    ) -> Path:
        """Checkpoint model, tokenizer, optimizer, RNG, `loop_state` and the trainer's
        state (under the reserved key "trainer") as checkpoints/step_<step>; the loop
        passes its own step, so distinct loop steps never share a folder. Without
        `step`, the trainer's update count names it."""
        step = self.steps if step is None else step
        loop_state = dict(loop_state or {})
        if "trainer" in loop_state:
            raise TrainerError('loop_state key "trainer" is reserved for the trainer\'s own state')
        loop_state["trainer"] = self.state_dict()
        full = None
        if self.config.fsdp:
            from posttrain.trainer.fsdp import full_state

            full = full_state(self.model, self.optimizer)  # a collective: every rank gathers
            if self.parallel.rank != 0:
                self.parallel.barrier()
                from posttrain.trainer.checkpoint import checkpoint_path

                return checkpoint_path(run_dir, step)
        path = save_checkpoint(
            run_dir,
            self.model,
            tokenizer,
            self.optimizer,
            loop_state,
            step,
            keep=self.config.keep_checkpoints,
            full_state=full,
            extra=self._save_draft_head if self.draft_head is not None else None,
        )
        if self.config.fsdp:
            self.parallel.barrier()
        return path

    def _save_draft_head(self, folder: Path) -> None:
        """trainer.draft_head: the head (model/draft_head.py's files) and its optimizer's state
        (`draft_head_optimizer.pt`) into checkpoint folder `folder`."""
        assert self.draft_head is not None and self._draft_opt is not None
        self.draft_head.save(folder)
        torch.save(self._draft_opt.state_dict(), folder / DRAFT_OPTIMIZER)

    def _resume_draft_head(self, folder: Path) -> None:
        """The head and its optimizer as checkpoint `folder` saved them; a checkpoint without a
        head (trained before trainer.draft_head was on) leaves the fresh one."""
        from posttrain.model.draft_head import has_head, load

        if self.draft_head is None or self._draft_opt is None or not has_head(folder):
            return
        saved = load(folder, self.draft_head.hidden)
        if saved.depth != self.draft_head.depth:
            raise ConfigError(
                f"trainer.draft_head.depth is {self.draft_head.depth}, the checkpoint's head ({folder}) has "
                f"depth {saved.depth}; resume with trainer.draft_head.depth={saved.depth}"
            )
        self.draft_head.load_state_dict(saved.state_dict())  # weights and its draft vocabulary's counts
        self._draft_opt.load_state_dict(torch.load(folder / DRAFT_OPTIMIZER, map_location=self.device))
        for group in self._draft_opt.param_groups:
            group["lr"] = self.config.draft_head.lr

    def save_weights(self, path: str | Path) -> Path:
        """Only the weights (the adapter alone for LoRA) as a Hugging Face directory at
        `path`, for an inference server; with FSDP every rank calls it and rank 0 writes."""
        path = Path(path)
        if not self.config.fsdp:
            self.model.save_pretrained(path)
            return path
        from posttrain.trainer.fsdp import full_state

        state, _ = full_state(self.model, self.optimizer)
        if self.parallel.rank == 0:
            self.model.save_pretrained(path, state_dict=state)
        self.parallel.barrier()
        return path

    def close(self) -> None:
        """Nothing to release in one process (a distributed leader tells its followers to stop)."""

    def resume(self, path: str | Path) -> dict[str, Any]:
        """Restore from a checkpoint (or a run directory's latest); returns the
        caller's loop state. Model parameters are overwritten in place. The optimizer's moments
        and step counts come from the checkpoint, its learning rate from this trainer's config
        (`trainer.lr`, which a resume may change: configs/resume.py)."""
        ckpt = load_checkpoint(path, self.model, self.optimizer)
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr
        self._resume_draft_head(ckpt.path)
        loop_state = dict(ckpt.loop_state)
        if "trainer" not in loop_state:
            raise TrainerError(f"checkpoint {ckpt.path} holds no trainer state (not saved by Trainer.save)")
        self.load_state_dict(loop_state.pop("trainer"))
        self._take_snapshot()
        return loop_state


# ---------------------------------------------------------------- the entropy bonus


def entropy_bonus(
    logp_nv: Tensor, rows: Sequence[TrainRow], row_n: Tensor, n_tokens: int
) -> tuple[Tensor | None, float]:
    """`entropy_term` of the token entropies of log-probs `logp_nv` (n x vocab)."""
    with_bonus = any(r.entropy_coef > 0.0 for r in rows)
    if with_bonus:
        entropy_n = -(logp_nv.exp() * logp_nv).sum(-1)  # not entr(p): its gradient at p = 0 is inf x 0
    else:
        with torch.no_grad():
            entropy_n = torch.special.entr(logp_nv.exp()).sum(-1)
    return entropy_term(entropy_n, rows, row_n, n_tokens)


def entropy_term(
    entropy_n: Tensor, rows: Sequence[TrainRow], row_n: Tensor, n_tokens: int
) -> tuple[Tensor | None, float]:
    """The entropy term of a micro-batch, sum_n coef_row(n) x H_n / n_tokens, where H_n is the
    entropy of the policy's distribution (at the sampling temperature) at loss token n and
    `n_tokens` the step's loss tokens (so micro-batches sum to the step's term); None when no
    row has a coefficient. Also the summed token entropy (detached), for the stats."""
    entropy_sum = float(entropy_n.detach().sum())
    if not any(r.entropy_coef > 0.0 for r in rows):
        return None, entropy_sum
    coef_b = torch.tensor([r.entropy_coef for r in rows], dtype=entropy_n.dtype, device=entropy_n.device)
    return (coef_b[row_n] * entropy_n).sum() / max(n_tokens, 1), entropy_sum


# ---------------------------------------------------------------- packing


def pack_rows(rows: Sequence[TrainRow], device: torch.device, share: bool = False) -> _Packed:
    """Right-pad prompt+completion; index_bc[b, c] is the position whose
    logits predict completion token c of row b (prompt length - 1 + c).
    Built with tensor ops over the concatenated tokens (no per-token Python).
    With `share`, also the distinct prompts and the completions apart (`_SharedPrompts`)
    when that forwards fewer padded tokens."""
    prompt_b = torch.tensor([len(r.prompt_ids) for r in rows])
    comp_b = torch.tensor([len(r.completion_ids) for r in rows])
    seq_len, comp_len = int((prompt_b + comp_b).max()), int(comp_b.max())
    in_seq_bs = torch.arange(seq_len)[None, :] < (prompt_b + comp_b)[:, None]
    in_comp_bc = torch.arange(comp_len)[None, :] < comp_b[:, None]
    ids_bs = torch.zeros(len(rows), seq_len, dtype=torch.long)
    ids_bs[in_seq_bs] = torch.tensor(list(chain.from_iterable(r.prompt_ids + r.completion_ids for r in rows)))
    target_bc = torch.zeros(len(rows), comp_len, dtype=torch.long)
    mask_bc = torch.zeros(len(rows), comp_len)
    behaviour_bc = torch.zeros(len(rows), comp_len)
    if comp_len:
        target_bc[in_comp_bc] = torch.tensor(list(chain.from_iterable(r.completion_ids for r in rows)))
        mask_bc[in_comp_bc] = torch.tensor(list(chain.from_iterable(r.loss_mask for r in rows)), dtype=torch.float32)
        behaviour_bc[in_comp_bc] = torch.tensor(
            list(chain.from_iterable(r.behaviour_logprobs for r in rows)), dtype=torch.float32
        )
    index_bc = (prompt_b[:, None] - 1 + torch.arange(comp_len)[None, :]).clamp(max=max(seq_len - 2, 0))
    row_n, col_n = (mask_bc > 0).nonzero(as_tuple=True)
    shared = _share(rows, prompt_b, comp_len, seq_len, device) if share and comp_len else None
    return _Packed(
        input_ids_bs=ids_bs.to(device),
        attention_bs=in_seq_bs.long().to(device),
        index_bc=index_bc.to(device),
        target_bc=target_bc.to(device),
        mask_bc=mask_bc.to(device),
        behaviour_bc=behaviour_bc.to(device),
        temperature_b=torch.tensor([r.score_temperature for r in rows], dtype=torch.float32, device=device),
        first_index=int(prompt_b.min()) - 1,
        row_n=row_n.to(device),
        col_n=col_n.to(device),
        pos_n=(prompt_b[row_n] - 1 + col_n).to(device),
        target_n=target_bc[row_n, col_n].to(device),
        shared=shared,
    )


def pack_sequence(rows: Sequence[TrainRow], device: torch.device) -> _Packed:
    """The rows back to back in one sequence, no padding (trainer.packing_tokens): position ids
    restart at 0 for each row, so the decoder (transformers' packed-sequence mask, with no
    attention mask given) attends within each row only; the completion-aligned tensors are
    `pack_rows`' (row b, completion position c), the loss tokens' positions offset by the rows
    before them."""
    padded = pack_rows(rows, torch.device("cpu"))
    length_b = torch.tensor([len(r.prompt_ids) + len(r.completion_ids) for r in rows])
    start_b = length_b.cumsum(0) - length_b
    ids_s = torch.tensor(list(chain.from_iterable(r.prompt_ids + r.completion_ids for r in rows)))
    position_s = torch.arange(len(ids_s)) - start_b.repeat_interleave(length_b)
    packed = replace(
        padded,
        input_ids_bs=ids_s[None, :],
        attention_bs=torch.ones(1, len(ids_s), dtype=torch.long),
        first_index=0,
        pos_n=start_b[padded.row_n] + padded.pos_n,
        position_bs=position_s[None, :],
        seq_n=torch.zeros_like(padded.row_n),
    )
    return _to_device(packed, device)


def pack_bins(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Rows (by index) into sequences of at most `capacity` tokens, first fit by decreasing
    length (ties by index, so the same lengths give the same bins); a row longer than the
    capacity is a sequence of its own. Each bin lists its rows in index order."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fit = next((k for k, r in enumerate(room) if lengths[i] <= r), None)
        if fit is None:
            bins.append([i])
            room.append(capacity - lengths[i])
        else:
            bins[fit].append(i)
            room[fit] -= lengths[i]
    return [sorted(b) for b in bins]


def _share(
    rows: Sequence[TrainRow],
    prompt_b: Tensor,
    comp_len: int,
    seq_len: int,
    device: torch.device,
    always: bool = False,
) -> _SharedPrompts | None:
    """The rows as distinct prompts and completions, or None when that forwards no fewer
    padded tokens (the second pass's fixed cost included) than the rows' whole sequences."""
    index: dict[tuple[int, ...], int] = {}
    prompt_of = [index.setdefault(r.prompt_ids, len(index)) for r in rows]
    width = max(len(p) for p in index)
    shared_cost = len(index) * width + len(rows) * (comp_len - 1) + _PASS_COST_TOKENS
    if not always and shared_cost >= len(rows) * seq_len:
        return None
    prompts = list(index)
    length_u = torch.tensor([len(p) for p in prompts])
    prompt_ids_us = torch.zeros(len(prompts), width, dtype=torch.long)
    in_prompt_us = torch.arange(width)[None, :] < length_u[:, None]
    prompt_ids_us[in_prompt_us] = torch.tensor(list(chain.from_iterable(prompts)))
    inputs = comp_len - 1  # the last completion token predicts nothing
    input_len_b = torch.tensor([max(len(r.completion_ids) - 1, 0) for r in rows])
    in_input_bc = torch.arange(inputs)[None, :] < input_len_b[:, None]
    input_ids_bc = torch.zeros(len(rows), inputs, dtype=torch.long)
    if inputs:
        input_ids_bc[in_input_bc] = torch.tensor(list(chain.from_iterable(r.completion_ids[:-1] for r in rows)))
    return _SharedPrompts(
        prompt_ids_us=prompt_ids_us.to(device),
        prompt_mask_us=in_prompt_us.long().to(device),
        last_u=(length_u - 1).to(device),
        prompt_b=torch.tensor(prompt_of, device=device),
        input_ids_bc=input_ids_bc.to(device),
        mask_bc=in_input_bc.long().to(device),
        position_bc=(prompt_b[:, None] + torch.arange(inputs)[None, :]).to(device),
    )


def loss_token_logp(
    model: Any,
    head: tuple[Any, Any] | None,
    packed: _Packed,
    chunk: int | None,
    precision: str = "float32",
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Each loss token's log_softmax(logits / temperature), the entropy of that distribution
    (n each; the entropy with a gradient only for `entropy_grad`), and the loss positions'
    hidden states (None without `head`). When `head` (`split_head`) splits the model, only
    the positions that predict a loss token reach the LM head, and they reach it `chunk`
    positions at a time (chunked.py: no n x vocab tensor); otherwise the model's forward,
    from the first loss position on. The one home of this computation: the trainer's loss,
    its reference log-probs, `Trainer.token_logprobs` and the monitor's KL (monitor/kl.py)."""
    device = packed.input_ids_bs.device
    temperature_n = packed.temperature_b[packed.row_n]
    if head is None:
        with autocast(device, precision):
            logits_nv = _forward_logits(model, packed)
        logp_n, entropy_n = token_logp_entropy(
            lambda x: x, logits_nv, packed.target_n, temperature_n, None, entropy_grad
        )
        return logp_n, entropy_n, None
    decoder, lm_head = head
    with autocast(device, precision):
        if packed.shared is not None:
            hidden_nh = shared_prompt_hidden(decoder, packed.shared, packed.row_n, packed.col_n)
        else:
            hidden_bsh = decoder(**packed.decoder_inputs() | {"use_cache": False}).last_hidden_state
            hidden_nh = hidden_bsh[packed.sequence_n, packed.pos_n]

    def project(hidden: Tensor) -> Tensor:
        with autocast(device, precision):
            return lm_head(hidden)

    logp_n, entropy_n = token_logp_entropy(project, hidden_nh, packed.target_n, temperature_n, chunk, entropy_grad)
    return logp_n, entropy_n, hidden_nh


def shared_prompt_hidden(decoder: Any, shared: _SharedPrompts, row_n: Tensor, col_n: Tensor) -> Tensor:
    """The decoder's last hidden state at the position that predicts each loss token (n x
    hidden), forwarding each distinct prompt once: the prompts' keys and values, copied to
    their rows, are the cache the completions attend to (the same attention as over the
    whole sequence: the prompts' padding is masked, positions continue the prompt's)."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    prompt_ush = decoder(
        input_ids=shared.prompt_ids_us, attention_mask=shared.prompt_mask_us, past_key_values=cache, use_cache=True
    ).last_hidden_state
    prompt_n = shared.prompt_b[row_n]
    first_nh = prompt_ush[prompt_n, shared.last_u[prompt_n]]
    if shared.input_ids_bc.shape[1] == 0:  # one-token completions: the prompts predict all
        return first_nh
    for layer in cache.layers:  # each row's own copy of its prompt's keys and values
        layer.keys = layer.keys.index_select(0, shared.prompt_b)
        layer.values = layer.values.index_select(0, shared.prompt_b)
    completion_bch = decoder(
        input_ids=shared.input_ids_bc,
        attention_mask=torch.cat([shared.prompt_mask_us[shared.prompt_b], shared.mask_bc], dim=1),
        position_ids=shared.position_bc,
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    rest_nh = completion_bch[row_n, (col_n - 1).clamp(min=0)]
    return torch.where((col_n == 0)[:, None], first_nh, rest_nh)


def _forward_logits(model: Any, packed: _Packed) -> Tensor:
    """The model's own forward (logits_to_keep from the first loss position when it
    accepts it), then the logits at each loss token's position (n x vocab)."""
    kwargs: dict[str, Any] = {}
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft forwards kwargs
    if "logits_to_keep" in inspect.signature(inner.forward).parameters:
        kwargs["logits_to_keep"] = packed.input_ids_bs.shape[1] - packed.first_index
    logits_bsv = model(**packed.decoder_inputs(), **kwargs).logits
    offset = packed.input_ids_bs.shape[1] - logits_bsv.shape[1]
    return logits_bsv[packed.sequence_n, packed.pos_n - offset]


def _image_tokens(model: Any) -> tuple[int | None, int]:
    """A vision model's image token id and the run of them one image takes; (None, 0) for text."""
    from posttrain.model.vision import is_vision_model

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(inner, "config", None)
    if config is None or not is_vision_model(config):
        return None, 0
    return int(config.image_token_index), int(config.image_seq_length)


def split_head(model: Any) -> tuple[Any, Any] | None:
    """(decoder, lm_head) of a Hugging Face causal LM whose logits are exactly
    lm_head(decoder(...).last_hidden_state), checked once on a short input (a model
    that scales or soft-caps its logits fails the check); None otherwise."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: adapters sit inside
    get_decoder, get_head = getattr(inner, "get_decoder", None), getattr(inner, "get_output_embeddings", None)
    if not (callable(get_decoder) and callable(get_head)):
        return None
    decoder, head = get_decoder(), get_head()
    if decoder is None or head is None or decoder is inner:
        return None
    device = next(inner.parameters()).device
    ids = torch.arange(1, 7, device=device)[None, :] % int(inner.get_input_embeddings().num_embeddings)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            full = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()
            split = head(decoder(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).last_hidden_state)
    except Exception:  # a decoder with another calling convention: use the model's forward
        return None
    finally:
        model.train(was_training)
    return (decoder, head) if torch.allclose(full, split.float(), rtol=1e-5, atol=1e-5) else None


def shares_prompts(model: Any, head: tuple[Any, Any]) -> bool:
    """Whether `shared_prompt_hidden` gives this model's logits: its layers all attend to
    the whole sequence (no sliding window or linear attention, whose cache is not a plain
    key/value per position) and a probe of two rows sharing a prompt gives the logits of
    the whole sequences."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(inner, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if any(t != "full_attention" for t in getattr(text, "layer_types", None) or []):
        return False
    vocab = int(inner.get_input_embeddings().num_embeddings)
    device = next(inner.parameters()).device
    rows = [
        TrainRow(
            tuple(i % vocab for i in prompt),
            tuple(i % vocab for i in comp),
            (0.0,) * len(comp),
            0.0,
            0,
            (1,) * len(comp),
        )
        for prompt, comp in (((1, 2, 3), (4, 5, 6)), ((1, 2, 3), (6,)), ((2, 3), (5, 4, 3, 2)))
    ]
    packed = pack_rows(rows, device)
    decoder, lm_head = head
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            whole = decoder(input_ids=packed.input_ids_bs, attention_mask=packed.attention_bs, use_cache=False)
            want = lm_head(whole.last_hidden_state[packed.row_n, packed.pos_n]).float()
            shared = _share(rows, torch.tensor([len(r.prompt_ids) for r in rows]), 4, 0, device, always=True)
            got = lm_head(shared_prompt_hidden(decoder, shared, packed.row_n, packed.col_n)).float()
    except Exception:  # a decoder that takes no cache this way: every row forwards its whole sequence
        return False
    finally:
        model.train(was_training)
    return torch.allclose(want, got, rtol=1e-4, atol=1e-5)


def packs_rows(model: Any) -> bool:
    """Whether rows packed into one sequence (`pack_sequence`) give this model the logits of
    the same rows right-padded, on a probe of three short rows (one of one token)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    vocab = int(inner.get_input_embeddings().num_embeddings)
    rows = [
        TrainRow(tuple(i % vocab for i in p), tuple(i % vocab for i in c), (0.0,) * len(c), 0.0, 0, (1,) * len(c))
        for p, c in (((1, 2, 3), (4, 5)), ((6,), (7,)), ((2, 3, 4, 5), (6, 7, 8)))
    ]
    device = next(inner.parameters()).device
    padded, packed = pack_rows(rows, device), pack_sequence(rows, device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            want = model(**padded.decoder_inputs()).logits[padded.row_n, padded.pos_n].float()
            got = model(**packed.decoder_inputs()).logits[packed.sequence_n, packed.pos_n].float()
    except Exception:  # a model that takes no position ids this way: it cannot pack
        return False
    finally:
        model.train(was_training)
    return torch.allclose(want, got, rtol=1e-4, atol=1e-5)


def cost_slices(
    lengths: Sequence[int], max_tokens: int | None, prompts: Sequence[tuple[int, ...]] | None = None
) -> list[tuple[int, int]]:
    """Consecutive [start, end) slices of rows sorted by length (ascending) that minimise
    the modelled cost of the step's forward/backward passes: each pass costs
    _PASS_COST_TOKENS plus rows x longest row (padding included), and none exceeds
    `max_tokens` padded tokens (a longer row gets a pass of its own). With the rows'
    `prompts` (the step forwards each distinct prompt of a micro-batch once, `_share`), a
    slice costs the cheaper of that and two passes over its distinct prompts x longest
    prompt plus rows x longest completion. Exact dynamic programming over the distinct
    lengths (rows of equal length never need a cut)."""
    if not lengths:
        return []
    bounds = [i for i in range(1, len(lengths)) if lengths[i] != lengths[i - 1]] + [len(lengths)]
    segments = _prompt_segments(lengths, bounds, prompts) if prompts is not None else None
    best = [0.0] + [math.inf] * len(bounds)  # best[k]: cost of the rows before bounds[k - 1]
    cut_at = [0] * (len(bounds) + 1)
    for k, end in enumerate(bounds, 1):
        distinct: set[int] = set()
        widest = longest_completion = 0
        for j in reversed(range(k)):  # the slice [start, end), growing towards the first row
            start = bounds[j - 1] if j else 0
            cost = _PASS_COST_TOKENS + (end - start) * lengths[end - 1]
            if segments is not None:
                ids, wide, completion = segments[j]
                distinct |= ids
                widest, longest_completion = max(widest, wide), max(longest_completion, completion)
                shared = 2 * _PASS_COST_TOKENS + len(distinct) * widest + (end - start) * (longest_completion - 1)
                cost = min(cost, shared)
            cost += best[j]
            if cost < best[k]:
                best[k], cut_at[k] = cost, j
    ends, k = [], len(bounds)
    while k:
        ends.append(k)
        k = cut_at[k]
    slices, start = [], 0
    for k in reversed(ends):
        end = bounds[k - 1]
        slices += [(start + a, start + b) for a, b in micro_slices(lengths[start:end], end - start, max_tokens)]
        start = end
    return slices


def _prompt_segments(
    lengths: Sequence[int], bounds: Sequence[int], prompts: Sequence[tuple[int, ...]]
) -> list[tuple[set[int], int, int]]:
    """For each run of equal lengths (ending at `bounds`): its distinct prompts (as small ints, so
    each prompt is hashed once), its longest prompt and its longest completion."""
    index: dict[tuple[int, ...], int] = {}
    ids = [index.setdefault(p, len(index)) for p in prompts]
    out, start = [], 0
    for end in bounds:
        rows = range(start, end)
        widest = max(len(prompts[i]) for i in rows)
        out.append(({ids[i] for i in rows}, widest, max(lengths[i] - len(prompts[i]) for i in rows)))
        start = end
    return out


def _order_key(row: TrainRow) -> tuple[Any, ...]:
    """Length first; ties broken by content, so any order of the same rows gives the
    same micro-batches and the same float summation order."""
    return (
        len(row.prompt_ids) + len(row.completion_ids),
        row.prompt_ids,
        row.completion_ids,
        row.reward,
        row.loss_mask,
        row.behaviour_logprobs,
    )


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else the physical memory size."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _to_device(packed: _Packed, device: torch.device) -> _Packed:
    fields = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in vars(packed).items()}
    if packed.shared is not None:
        fields["shared"] = _SharedPrompts(**{k: v.to(device) for k, v in vars(packed.shared).items()})
    return _Packed(**fields)
