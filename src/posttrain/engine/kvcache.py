"""A KV cache in preallocated slabs for the hf engine's decoding loop.

Invariant: each layer's live keys and values are the first `length`
positions of a slab of fixed capacity, so appending a token writes one
column instead of copying the whole cache (DynamicCache concatenates every
step); `reorder_cache(index)` selects, repeats or drops batch rows, and is
how a group's prompt cache is copied to its samples; `preload` starts a
batch from kept contexts (engine/sessions.py) and `row_kv` copies one row's
context out. Speculative decoding (engine/hf.py) drops rejected draft
columns with `truncate` (the shared length) and the attention mask (per
row), and `compact` moves each row's live columns together when the holes
would overflow the slab. With `int8` (`engine.kv_dtype: int8`) the slabs hold
int8 values and one float32 scale per (row, head, position), and every read
(`update`, `row_kv`) dequantizes, so callers see the model's dtype either way;
in the model's dtype, `keys`/`values` are views of the slabs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class SlabLayer(DynamicLayer):
    """One attention layer's keys and values in slabs of `max_rows` x
    `capacity` positions; the live cache is the first `rows` rows and the
    first `length` positions. With `int8`, the slabs hold int8 values and one
    float32 scale per (row, head, position): absmax over the head dim / 127,
    rounded to nearest; `update` returns the live cache dequantized (a copy
    that lives for the layer's attention only, so one layer's float keys and
    values exist at a time) and `keys`/`values` are not kept."""

    def __init__(self, capacity: int, max_rows: int, int8: bool = False) -> None:
        super().__init__()
        self.capacity, self.max_rows, self.int8 = capacity, max_rows, int8
        self.length = self.rows = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.rows = key_states.shape[0]
        k_shape = (self.max_rows, key_states.shape[1], self.capacity, key_states.shape[-1])
        v_shape = (self.max_rows, value_states.shape[1], self.capacity, value_states.shape[-1])
        kind = torch.int8 if self.int8 else key_states.dtype
        self._k = key_states.new_empty(k_shape, dtype=kind)
        self._v = value_states.new_empty(v_shape, dtype=kind)
        if self.int8:
            self._ks = key_states.new_empty((*k_shape[:3], 1), dtype=torch.float32)
            self._vs = value_states.new_empty((*v_shape[:3], 1), dtype=torch.float32)
        self.is_initialized = True

    def _slabs(self) -> list[torch.Tensor]:
        """Every slab this layer holds (int8: the values and their scales)."""
        return [self._k, self._v, self._ks, self._vs] if self.int8 else [self._k, self._v]

    def nbytes(self) -> int:
        """Bytes of the slabs (allocated capacity, not only the live part)."""
        return sum(t.numel() * t.element_size() for t in self._slabs()) if self.is_initialized else 0

    def _put(self, row: int | slice, lo: int, hi: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write `keys`/`values` at positions [lo, hi) of batch rows `row` (quantized with int8)."""
        if not self.int8:
            self._k[row, :, lo:hi] = keys
            self._v[row, :, lo:hi] = values
            return
        for slab, scales, x in ((self._k, self._ks, keys), (self._v, self._vs, values)):
            q, scale = quantize(x)
            slab[row, :, lo:hi] = q
            scales[row, :, lo:hi] = scale

    def _live(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The live keys and values in the model's dtype (dequantized copies with int8)."""
        rows, n = self.rows, self.length
        if not self.int8:
            return self._k[:rows, :, :n], self._v[:rows, :, :n]
        k = dequantize(self._k[:rows, :, :n], self._ks[:rows, :, :n], self.dtype)
        return k, dequantize(self._v[:rows, :, :n], self._vs[:rows, :, :n], self.dtype)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity or key_states.shape[0] != self.rows:
            raise RuntimeError(
                f"KV slab misuse: {key_states.shape[0]} rows x {end} positions into "
                f"{self.rows} rows x capacity {self.capacity}"
            )
        self._put(slice(0, self.rows), self.length, end, key_states, value_states)
        self.length = end
        self._refresh()
        return self._live()

    def _refresh(self) -> None:
        if self.int8:  # no float view to keep: `update` dequantizes for each attention
            return
        self.keys = self._k[: self.rows, :, : self.length]
        self.values = self._v[: self.rows, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Rows `beam_idx` of the live cache become the live cache, in place;
        only the filled positions are copied."""
        if not self.is_initialized:
            return
        rows = beam_idx.shape[0]
        if rows > self.max_rows:
            raise RuntimeError(f"KV slab holds {self.max_rows} rows, {rows} asked for")
        idx = beam_idx.to(self._k.device)
        for slab in self._slabs():
            live = slab[: self.rows, :, : self.length]
            if rows > self.rows:  # a prompt's cache copied to its samples: gather from a copy of the few source rows
                torch.index_select(live.clone(), 0, idx, out=slab[:rows, :, : self.length])  # straight into the slab
            else:  # rows dropped: gather the fewer kept rows, then write them back
                slab[:rows, :, : self.length] = live.index_select(0, idx)
        self.rows = rows
        self._refresh()

    def preload(self, rows: int, length: int, pieces: list[tuple[int, torch.Tensor, torch.Tensor]]) -> None:
        """Start the live cache at `rows` rows x `length` positions, zero but for `pieces`: (row,
        keys, values) of shape (heads, n, head_dim), written right-aligned, at positions
        [length - n, length) of that row (a kept context resumed; the zeros are masked out)."""
        _, k0, v0 = pieces[0]
        if not self.is_initialized:
            self.lazy_initialization(k0[None], v0[None])
        if rows > self.max_rows or length > self.capacity:
            raise RuntimeError(f"KV slab misuse: preload {rows} x {length} into {self.max_rows} x {self.capacity}")
        self.rows, self.length = rows, length
        for slab in self._slabs():
            slab[:rows, :, :length].zero_()
        for row, k, v in pieces:
            n = k.shape[-2]
            self._put(row, length - n, length, k, v)
        self._refresh()

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions of the live cache."""
        if self.is_initialized:
            self.length = min(self.length, length)
            self._refresh()

    def compact(self, index: torch.Tensor) -> None:
        """Position j of row r becomes old position index[r, j] (rows x new length)."""
        if not self.is_initialized:
            return
        rows, width = index.shape
        idx = index.to(self._k.device)
        for slab in self._slabs():
            live = slab[:rows, :, : self.length]
            gather = idx[:, None, :, None].expand(rows, live.shape[1], width, live.shape[-1])
            slab[:rows, :, :width] = live.gather(2, gather)
        self.length = width
        self._refresh()

    def row_kv(self, row: int, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the live cache's keys and values of batch row `row` at `columns` (in the
        model's dtype: dequantized with int8)."""
        n = self.length
        k, v = self._k[row, :, :n].index_select(1, columns), self._v[row, :, :n].index_select(1, columns)
        if not self.int8:
            return k, v
        ks, vs = self._ks[row, :, :n].index_select(1, columns), self._vs[row, :, :n].index_select(1, columns)
        return dequantize(k, ks, self.dtype), dequantize(v, vs, self.dtype)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values and float32 scales of `x` (..., head_dim), one scale per vector over its last
    dim: absmax / 127, so the largest entry maps to +-127 and the rest round to nearest (an
    all-zero vector gets scale 1 and stays zero)."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(xf / scale).clamp_(-127, 127).to(torch.int8), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`quantize`'s inverse up to rounding: q x scale, in `dtype`."""
    return (q.float() * scale).to(dtype)


KV_DTYPES = ("auto", "int8")
"""`kv_dtype`: auto keeps the KV cache in the model's dtype; int8 quantizes it (`SlabLayer`)."""


def slab_capable(model_config: Any) -> bool:
    """Whether every layer of the model uses full attention (the slab cache's case)."""
    text_config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    layer_types = getattr(text_config, "layer_types", None) or []
    return all(t == "full_attention" for t in layer_types)


LayerKV = tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]
"""Per layer, keys and values of one sequence (each heads x n x head_dim)."""


def preload(cache: Cache, rows: int, length: int, pieces: Sequence[tuple[int, LayerKV]]) -> None:
    """`SlabLayer.preload` on every layer: `pieces` holds (row, per-layer keys, per-layer values)."""
    for i, layer in enumerate(cache.layers):
        if not isinstance(layer, SlabLayer):
            raise RuntimeError("preload needs a slab cache (a model whose layers all use full attention)")
        layer.preload(rows, length, [(row, ks[i], vs[i]) for row, (ks, vs) in pieces])


def row_kv(cache: Cache, row: int, columns: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Per layer, copies of batch row `row`'s keys and values at `columns` (shape heads x n x head_dim)."""
    got = [layer.row_kv(row, columns) for layer in cache.layers if isinstance(layer, SlabLayer)]
    if len(got) != len(cache.layers):
        raise RuntimeError("row_kv needs a slab cache (a model whose layers all use full attention)")
    return tuple(k for k, _ in got), tuple(v for _, v in got)


def _slabs(cache: Cache, what: str) -> list[SlabLayer]:
    layers = [layer for layer in cache.layers if isinstance(layer, SlabLayer)]
    if len(layers) != len(cache.layers):
        raise RuntimeError(f"{what} needs a slab cache (a model whose layers all use full attention)")
    return layers


def truncate(cache: Cache, length: int) -> None:
    """Keep the first `length` positions of every layer (rejected draft columns dropped)."""
    for layer in _slabs(cache, "truncate"):
        layer.truncate(length)


def compact(cache: Cache, mask: torch.Tensor) -> torch.Tensor:
    """Move each row's live columns (`mask` rows x length, 1 = live) to the right end of the
    first max-live-count positions, in order, and return the new mask (rows x that count, zeros
    on the left of rows with fewer live columns). Keys keep the positions they were computed at."""
    live = mask.bool()
    width = int(live.sum(dim=1).max())
    order = torch.sort(live.to(torch.int8), dim=1, stable=True).indices  # holes first, then live columns in order
    index = order[:, mask.shape[1] - width :]
    for layer in _slabs(cache, "compact"):
        layer.compact(index)
    return mask.gather(1, index)


def new_cache(model_config: Any, capacity: int, max_rows: int, int8: bool = False) -> Cache:
    """A slab cache of `max_rows` x `capacity` positions for models whose layers all use
    full attention (with `int8`, quantized slabs); any other model (sliding windows, linear
    attention) gets the library's DynamicCache, which handles its layer types (int8 refused)."""
    text_config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    if not slab_capable(model_config):
        if int8:
            raise RuntimeError("an int8 KV cache needs a slab cache (a model whose layers all use full attention)")
        return DynamicCache(config=model_config)
    return Cache(layers=[SlabLayer(capacity, max_rows, int8) for _ in range(text_config.num_hidden_layers)])
