"""A draft head: a small module on the policy's last hidden state that guesses the next tokens.

Invariant: the head owns only its own parameters (two norms, a fusing matrix and one residual
MLP block); it reads the policy's token embeddings and LM head as constants (detached), so
fitting it never changes the policy, and what it drafts changes only speed: every drafted
token is verified by the policy (engine/hf.py, serve/spec.py).

Shape (an EAGLE-style feature step, chained as in multi-token prediction): from the policy's
final hidden state h_t at position t (the one whose logits chose token x_{t+1}) and the
embedding of x_{t+1},

    s = fc([rms(h_t) ; rms(e(x_{t+1}))]);  s = s + down(silu(up(rms(s))))
    logits of x_{t+2} = lm_head(rms_out(s))

and s stands in for h_{t+1} at the next depth, with the drafted token as x_{t+2}. `fit_loss`
trains depth d on the policy's own sampled tokens, teacher-forced, from the head's own
feature at depth d - 1 (the state drafting will feed it). Saved as `draft_head.pt`
plus `draft_head.json` (its sizes) beside the model's weights (`save` / `load`).

The draft vocabulary (`vocab_top`, as FR-Spec's frequency-ranked drafting): the head counts the
tokens it was fitted on (`counts`, saved with it) and drafts over the `vocab_top` most frequent
of them only, so a draft step reads that many rows of the LM head instead of all (on the
135M real model with a 49,152-token vocabulary, a 4-token draft over the whole LM head costs
about 0.75 of a target forward on a CPU, memory bound). Only speed depends on it: a token
outside the draft vocabulary is never drafted, so it is decoded by the target as without a
head. The head is fitted over the same rows (`fit_loss`): a target outside them is left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posttrain.errors import ModelLoadError

WEIGHTS = "draft_head.pt"
"""The head's weights in a model or checkpoint folder (a torch state dict, read with
weights_only; not `*.safetensors`, which model loaders take for the model's own shards)."""
META = "draft_head.json"
"""The head's sizes (hidden, depth, eps) beside its weights."""


class DraftHead(nn.Module):
    """The head over a policy of hidden size `hidden`; drafts up to `depth` tokens."""

    def __init__(self, hidden: int, depth: int, eps: float = 1e-6, seed: int = 0, vocab_top: int = 0) -> None:
        super().__init__()
        if hidden < 1 or depth < 1 or vocab_top < 0:
            raise ValueError(
                f"DraftHead needs hidden, depth >= 1 and vocab_top >= 0, got {hidden}, {depth}, {vocab_top}"
            )
        self.hidden, self.depth, self.eps, self.vocab_top = hidden, depth, eps, vocab_top
        self.register_buffer("counts", torch.zeros(0, dtype=torch.long))
        """How often each token id was a fitted target (empty until the first fit)."""
        self._vocab: tuple[tuple[int, ...], Tensor, Tensor] | None = None
        """The draft vocabulary cached: (what it was made from, its token ids, their LM-head rows)."""
        self.norm_h = nn.Parameter(torch.ones(hidden))
        self.norm_e = nn.Parameter(torch.ones(hidden))
        self.norm_s = nn.Parameter(torch.ones(hidden))
        self.norm_out = nn.Parameter(torch.ones(hidden))
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.up = nn.Linear(hidden, 2 * hidden, bias=False)
        self.down = nn.Linear(2 * hidden, hidden, bias=False)
        gen = torch.Generator().manual_seed(seed)  # its own generator: the global RNG is untouched
        with torch.no_grad():
            eye = torch.eye(hidden)
            noise = torch.randn(hidden, hidden, generator=gen) * 0.02
            self.fc.weight.copy_(torch.cat([eye + noise, eye], dim=1) * 0.5)
            self.up.weight.copy_(torch.randn(2 * hidden, hidden, generator=gen) * hidden**-0.5)
            self.down.weight.zero_()

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        counts = state_dict.get(prefix + "counts")  # counts of any vocabulary load (the buffer starts empty)
        if isinstance(counts, Tensor) and counts.shape != self.counts.shape:
            self.counts = torch.zeros(counts.shape, dtype=torch.long, device=self.counts.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _rms(self, x: Tensor, w: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, self.eps)

    def step(self, state_nh: Tensor, token_n: Tensor, embed_vh: Tensor) -> Tensor:
        """The next feature: from states `state_nh` and the tokens that followed them."""
        x = torch.cat([self._rms(state_nh, self.norm_h), self._rms(F.embedding(token_n, embed_vh), self.norm_e)], -1)
        s = self.fc(x)
        return s + self.down(F.silu(self.up(self._rms(s, self.norm_s))))

    def logits(self, state_nh: Tensor, lm_vh: Tensor) -> Tensor:
        """Float32 logits (n, vocab) of the token after the one a state was fed."""
        return F.linear(self._rms(state_nh, self.norm_out), lm_vh).float()

    def fit_loss(
        self,
        hidden_nh: Tensor,
        target_n: Tensor,
        row_n: Tensor,
        col_n: Tensor,
        embed_vh: Tensor,
        lm_vh: Tensor,
        count: bool = True,
    ) -> tuple[Tensor, list[float]]:
        """The mean over depths of the cross-entropy of each loss token `depth` positions ahead.

        `hidden_nh[i]` is the policy's hidden state at the position that predicts `target_n[i]`
        (row `row_n[i]`, column `col_n[i]`), the rows' loss positions in order; depth d of
        position i is trained when positions i..i+d are consecutive in one row. Returns the loss
        (0 with no gradient path when nothing is trainable) and each depth's accuracy. The caller
        passes `hidden_nh` detached (trainer/trainer.py does), so the loss reaches no policy weight.
        With `count`, every target first joins `counts`. With a draft vocabulary (`draft_vocab`)
        the head is fitted as it drafts: logits over that vocabulary only (its LM-head rows), a
        target outside it left out of the loss (it is never drafted) and counted wrong in the
        accuracy."""
        vocab = int(lm_vh.shape[0])
        if count:
            self.count(target_n, vocab)
        ids, rows = self.draft_vocab(lm_vh)
        where = None  # token id -> its index in the draft vocabulary (-1: outside)
        if ids is not None:
            where = torch.full((vocab,), -1, dtype=torch.long, device=target_n.device)
            where[ids.to(target_n.device)] = torch.arange(len(ids), device=target_n.device)
        state, loss, acc = hidden_nh, hidden_nh.new_zeros(()), []
        ok = torch.ones_like(target_n, dtype=torch.bool)
        n = len(target_n)
        for d in range(1, min(self.depth, n - 1) + 1):
            m = n - d  # state[i] now stands at position i + d - 1 and was fed target[i + d - 1]
            state = self.step(state[:m], target_n[d - 1 : d - 1 + m], embed_vh)
            same_row = row_n[d : d + m] == row_n[d - 1 : d - 1 + m]
            ok = ok[:m] & same_row & (col_n[d : d + m] == col_n[d - 1 : d - 1 + m] + 1)
            if not bool(ok.any()):
                break
            logits, label = self.logits(state[ok], rows), target_n[d : d + m][ok]
            if where is None:
                loss = loss + F.cross_entropy(logits, label) / self.depth
                acc.append(float((logits.argmax(-1) == label).float().mean()))
                continue
            sub = where[label]
            inside = sub >= 0
            if bool(inside.any()):
                loss = loss + F.cross_entropy(logits[inside], sub[inside]) / self.depth
            acc.append(float((ids[logits.argmax(-1)].to(label.device) == label).float().mean()))
        return loss, acc

    @torch.no_grad()
    def count(self, tokens: Tensor, vocab: int) -> None:
        """Add `tokens` (ids below `vocab`, the LM head's rows) to `counts`."""
        if self.counts.numel() != vocab:  # the first fit (or a model of another vocabulary): start counting
            self.counts = torch.zeros(vocab, dtype=torch.long, device=tokens.device)
        self.counts += torch.bincount(tokens.reshape(-1).to(self.counts.device), minlength=vocab)[:vocab]

    def draft_vocab(self, lm_vh: Tensor) -> tuple[Tensor | None, Tensor]:
        """(token ids, their LM-head rows) the head drafts over: the `vocab_top` most frequent
        fitted tokens (those counted at least once); (None, `lm_vh`), the whole vocabulary, when
        `vocab_top` is 0 or nothing was counted for a vocabulary of this size. Cached until the
        counts or the LM head change (tensor versions: an in-place weight update counts)."""
        counts = self.counts
        if self.vocab_top <= 0 or counts.numel() != lm_vh.shape[0]:
            return None, lm_vh
        key = (counts.data_ptr(), counts._version, lm_vh.data_ptr(), lm_vh._version, self.vocab_top)
        if self._vocab is None or self._vocab[0] != key:
            k = min(self.vocab_top, int((counts > 0).sum()))
            if k == 0:
                return None, lm_vh
            ids = torch.topk(counts, k).indices.to(lm_vh.device)
            self._vocab = (key, ids, lm_vh.index_select(0, ids).contiguous())
        return self._vocab[1], self._vocab[2]

    @torch.no_grad()
    def draft(self, hidden_bh: Tensor, token_b: Tensor, k: int, embed_vh: Tensor, lm_vh: Tensor) -> Tensor:
        """Greedy drafts (rows, min(k, depth)): from each row's last hidden state and the token
        it chose, the head's argmax over its draft vocabulary (`draft_vocab`) chained depth after depth."""
        ids, rows = self.draft_vocab(lm_vh)
        state, token, out = hidden_bh, token_b, []
        for _ in range(min(k, self.depth)):
            state = self.step(state.to(self.fc.weight.dtype), token, embed_vh)
            best = self.logits(state, rows).argmax(-1)
            token = best if ids is None else ids[best]
            out.append(token)
        return torch.stack(out, dim=1) if out else token_b.new_zeros((len(token_b), 0))

    def save(self, folder: str | Path) -> None:
        """Write `draft_head.pt` and `draft_head.json` into `folder`."""
        folder = Path(folder)
        torch.save({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}, folder / WEIGHTS)
        meta = {"hidden": self.hidden, "depth": self.depth, "eps": self.eps, "vocab_top": self.vocab_top}
        (folder / META).write_text(json.dumps(meta))


def has_head(folder: str | Path) -> bool:
    """Whether `folder` holds a draft head."""
    return (Path(folder) / WEIGHTS).is_file()


def load(folder: str | Path, hidden: int | None = None) -> DraftHead:
    """The draft head saved in `folder`; ModelLoadError naming the file when it is missing,
    unreadable, or made for another hidden size than `hidden`."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / META).read_text())
        top = int(meta.get("vocab_top", 0))  # a head saved before the draft vocabulary drafts over all
        head = DraftHead(int(meta["hidden"]), int(meta["depth"]), float(meta.get("eps", 1e-6)), vocab_top=top)
        state = torch.load(folder / WEIGHTS, map_location="cpu", weights_only=True)
        state.setdefault("counts", torch.zeros(0, dtype=torch.long))
        if not isinstance(state["counts"], Tensor) or state["counts"].dim() != 1:
            raise ValueError(f"counts is not a vector of token counts: {type(state['counts']).__name__}")
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError) as exc:
        raise ModelLoadError(f"{folder / WEIGHTS}: no readable draft head ({exc})") from None
    if hidden is not None and head.hidden != hidden:
        raise ModelLoadError(f"{folder / META}: a head for hidden size {head.hidden}, the model's is {hidden}")
    try:
        head.load_state_dict(state)
    except RuntimeError as exc:
        raise ModelLoadError(f"{folder / WEIGHTS}: weights do not fit {META}'s sizes ({exc})") from None
    return head.eval()


def load_if_any(folder: str | Path, model: Any) -> DraftHead | None:
    """The draft head in model folder `folder` for `model` (None when it holds none)."""
    return load(folder, int(model.config.hidden_size)) if has_head(folder) else None


def policy_tables(model: Any) -> tuple[Tensor, Tensor]:
    """The policy's (token embedding, LM head) weight matrices, detached (vocab x hidden each)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.get_input_embeddings().weight.detach(), inner.get_output_embeddings().weight.detach()
