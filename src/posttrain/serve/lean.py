"""A lean decode path over the same weights, used as the fast tier's draft model.

Invariant: `LeanDecoder` computes the same function as the Hugging Face
Qwen2/Llama-family module it was built from (RMSNorm, rotary attention with
grouped KV heads, SwiGLU MLP; logits match to float32 rounding), with fused
QKV and gate/up matrices stored as (in, out) and a preallocated KV cache, so
one decoding step costs a few dozen tensor ops instead of hundreds of module
calls, and a step of one to three rows reads each weight once at the speed
of memory (a one-row F.linear over a (out, in) weight ran at half that here:
bench/RESULTS.md, "The lean decoder's weight layout"). It drafts for the
fast tier, and verifies there (`LeanTarget`). Built from a snapshot of the weights;
rebuilt when they change. It keeps each computed position's final (normed) hidden state
(`hidden`), which `HeadDrafter` drafts from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from posttrain.errors import ConfigError
from posttrain.model.arch import position_limit

SUPPORTED = ("qwen2", "llama", "mistral")


class LeanDecoder:
    """Batch-1 causal decoding with a fixed-size KV cache."""

    def __init__(
        self, model: Any, max_positions: int | None = None, int8: bool = False, layout: str = "in_out"
    ) -> None:
        """`layout`: how float weights are held, "in_out" (x @ w, the default) or "out_in" (as the
        module holds them, F.linear; kept to measure the two side by side: bench/serving.py costs)."""
        if layout not in ("in_out", "out_in"):
            raise ConfigError(f"lean decoder: layout must be 'in_out' or 'out_in', got {layout!r}")
        self.layout = "out_in" if int8 else layout
        cfg = model.config
        if cfg.model_type not in SUPPORTED:
            raise ConfigError(
                f"lean draft: model_type {cfg.model_type!r} unsupported (supported: {', '.join(SUPPORTED)})"
            )
        if getattr(cfg, "use_sliding_window", False):
            raise ConfigError("lean draft: sliding-window attention is unsupported")
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.max_pos = max_positions or position_limit(cfg) or cfg.max_position_embeddings
        inner = model.model
        with torch.no_grad():
            self.embed = inner.embed_tokens.weight.detach().clone().float()
            self.layers = [self._layer(layer) for layer in inner.layers]
            self.norm = inner.norm.weight.detach().clone().float()
            self.lm_head = model.lm_head.weight.detach().clone().float()
            pos = torch.arange(self.max_pos)[None, :]
            cos, sin = inner.rotary_emb(self.embed[None, :1], pos)
        self.cos, self.sin = cos[0].float(), sin[0].float()  # (positions, head_dim)
        shape = (len(self.layers), self.kv_heads, self.max_pos, self.head_dim)
        self.k_cache, self.v_cache = torch.zeros(shape), torch.zeros(shape)
        self.hidden = torch.zeros(self.max_pos, cfg.hidden_size)
        """Each cached position's final normed hidden state (what the LM head reads)."""
        self.length = 0
        self.int8 = int8
        if int8:
            self.layers = [
                {k: (_pack(v, layer.get(k + "_b")) if k in _LINEARS else v) for k, v in layer.items()}
                for layer in self.layers
            ]
        elif self.layout == "in_out":  # x @ w reads each weight once a step at memory speed (bench/RESULTS.md)
            for layer in self.layers:
                for k in _LINEARS:
                    layer[k] = layer[k].t().contiguous()
        self.lm_head_t = self.lm_head.t().contiguous() if self.layout == "in_out" else None
        """The LM head as (hidden, vocab), for steps of at most SMALL_ROWS rows (layout in_out)."""

    def _linear(self, x: torch.Tensor, w: Any, b: torch.Tensor | None = None) -> torch.Tensor:
        if self.int8:
            return torch.ops.quantized.linear_dynamic(x, w, True)
        if self.layout == "out_in":
            return F.linear(x, w, b)
        return x @ w if b is None else torch.addmm(b, x, w)  # w: (in, out)

    def _layer(self, layer: Any) -> dict[str, torch.Tensor | None]:
        att, mlp = layer.self_attn, layer.mlp

        def bias(lin: Any) -> torch.Tensor:
            return lin.bias.detach().float() if lin.bias is not None else torch.zeros(lin.out_features)

        qkv_b = torch.cat([bias(att.q_proj), bias(att.k_proj), bias(att.v_proj)])
        return {
            "ln1": layer.input_layernorm.weight.detach().clone().float(),
            "qkv": torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]).detach().clone().float(),
            "qkv_b": qkv_b if bool(qkv_b.any()) else None,
            "o": att.o_proj.weight.detach().clone().float(),
            "ln2": layer.post_attention_layernorm.weight.detach().clone().float(),
            "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach().clone().float(),
            "down": mlp.down_proj.weight.detach().clone().float(),
        }

    def truncate(self, length: int) -> None:
        """Forget cached positions at or after `length`."""
        self.length = min(self.length, length)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, self.eps)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    @torch.inference_mode()
    def forward(self, ids: Sequence[int]) -> torch.Tensor:
        """Logits (len(ids), vocab) of `ids` appended after the cached positions."""
        n, start = len(ids), self.length
        if start + n > self.max_pos:
            raise ConfigError(f"lean draft: {start + n} positions exceed max_positions {self.max_pos}")
        end = start + n
        x = self.embed[torch.tensor(ids)]
        cos, sin = self.cos[start:end], self.sin[start:end]
        mask = None
        if n > 1:
            mask = torch.ones(n, end, dtype=torch.bool).tril(diagonal=start)
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        qk_heads = self.heads + self.kv_heads
        for i, w in enumerate(self.layers):
            qkv = self._linear(self._rms(x, w["ln1"]), w["qkv"], w["qkv_b"])
            qk = self._rope(qkv[:, : q_dim + kv_dim].reshape(n, qk_heads, self.head_dim).transpose(0, 1), cos, sin)
            self.k_cache[i, :, start:end] = qk[self.heads :]
            self.v_cache[i, :, start:end] = (
                qkv[:, q_dim + kv_dim :].reshape(n, self.kv_heads, self.head_dim).transpose(0, 1)
            )
            att = F.scaled_dot_product_attention(
                qk[None, : self.heads],
                self.k_cache[None, i, :, :end],
                self.v_cache[None, i, :, :end],
                attn_mask=mask,
                enable_gqa=self.heads != self.kv_heads,
            )
            x = x + self._linear(att[0].transpose(0, 1).reshape(n, q_dim), w["o"])
            g, u = self._linear(self._rms(x, w["ln2"]), w["gate_up"]).chunk(2, dim=-1)
            x = x + self._linear(F.silu(g) * u, w["down"])
        self.length = end
        normed = self._rms(x, self.norm)
        self.hidden[start:end] = normed
        if n <= SMALL_ROWS and self.lm_head_t is not None:
            return normed @ self.lm_head_t
        return F.linear(normed, self.lm_head)


SMALL_ROWS = 3
"""Up to this many rows a step, the LM head is read as (hidden, vocab): on the machines measured
a one-row F.linear over the (vocab, hidden) head took twice the time (bench/RESULTS.md)."""
_LINEARS = ("qkv", "o", "gate_up", "down")


def _pack(w: torch.Tensor, b: torch.Tensor | None) -> Any:
    """Per-output-channel symmetric int8 weights, packed for quantized.linear_dynamic."""
    import warnings

    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qw = torch.quantize_per_channel(w, scales, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(qw, b)


class LeanTarget:
    """A LeanDecoder as the fast tier's verifying model (same float weights;
    logits equal the transformers module's to float32 rounding). One decoder
    is reused sequence after sequence: the engine decodes one at a time."""

    def __init__(self, decoder: LeanDecoder) -> None:
        self.decoder = decoder
        decoder.truncate(0)

    def forward(self, ids: Sequence[int]) -> torch.Tensor:
        return self.decoder.forward(ids)

    def truncate(self, length: int) -> None:
        self.decoder.truncate(length)


class LeanDrafter:
    """Drafts greedily (or with the shared sampler's noise) from a LeanDecoder,
    keeping its cache in sync with the sequence by its common prefix."""

    stop_ids: set[int] = set()

    def __init__(self, model: Any, name: str = "lean", int8: bool = False) -> None:
        self.decoder, self.name = LeanDecoder(model, int8=int8), name
        self.cached: list[int] = []

    def start(self, prompt: Sequence[int]) -> None:
        self.decoder.truncate(0)
        self.cached = []

    def finish(self, out: Sequence[int]) -> None:
        return None

    def propose(self, ids: Sequence[int], k: int, choose: Any, step: int) -> list[int]:
        keep = 0
        for a, b in zip(self.cached, ids):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(ids) - 1)
        room = self.decoder.max_pos - keep - 1
        k = min(k, room - (len(ids) - keep) + 1)
        if k <= 0:
            return []
        self.decoder.truncate(keep)
        feed, out = list(ids[keep:]), []
        self.cached = list(ids[:keep])
        for i in range(k):
            logits = self.decoder.forward(feed)
            self.cached.extend(feed)
            token, _ = choose(logits[-1], step + i)
            out.append(token)
            if token in self.stop_ids:
                break
            feed = [token]
        return out


class HeadDrafter:
    """Drafts with a co-trained draft head (model/draft_head.py) from the verifying lean
    decoder's hidden state at the position that chose the sequence's last token, greedily, up
    to the head's depth; no extra forward of the model. It drafts from the second generated
    token on (the head is trained on hidden states that chose a completion token, never on the
    prompt's last). Only with the lean target (whose `hidden` it reads); every drafted token is
    verified by that target."""

    name = "head"
    stop_ids: set[int] = set()

    def __init__(self, head: Any, decoder: LeanDecoder) -> None:
        if head.hidden != decoder.hidden.shape[1]:
            raise ConfigError(f"draft head: hidden size {head.hidden}, the model's is {decoder.hidden.shape[1]}")
        self.head, self.decoder = head.float().eval(), decoder

    def start(self, prompt: Sequence[int]) -> None:
        return None

    def finish(self, out: Sequence[int]) -> None:
        return None

    def propose(self, ids: Sequence[int], k: int, choose: Any, step: int) -> list[int]:
        pos = len(ids) - 2  # the position whose logits chose ids[-1]: cached by the target
        if step < 1 or pos >= self.decoder.length or k < 1:  # step 0: ids[-1] is the prompt's, not chosen
            return []
        last = torch.tensor([int(ids[-1])])
        with torch.inference_mode():
            drafted = self.head.draft(self.decoder.hidden[pos][None], last, k, self.decoder.embed, self.decoder.lm_head)
        out: list[int] = []
        for token in drafted[0].tolist():
            out.append(token)
            if token in self.stop_ids:
                break
        return out
