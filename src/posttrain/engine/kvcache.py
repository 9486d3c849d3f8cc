"""A KV cache in preallocated slabs for the hf engine's decoding loop.

Invariant: each layer's `keys`/`values` are views of the first `length`
positions of a slab of fixed capacity, so appending a token writes one
column instead of copying the whole cache (DynamicCache concatenates every
step); `reorder_cache(index)` selects, repeats or drops batch rows, and is
how a group's prompt cache is copied to its samples; `preload` starts a
batch from kept contexts (engine/sessions.py) and `row_kv` copies one row's
context out. Speculative decoding (engine/hf.py) drops rejected draft
columns with `truncate` (the shared length) and the attention mask (per
row), and `compact` moves each row's live columns together when the holes
would overflow the slab.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class SlabLayer(DynamicLayer):
    """One attention layer's keys and values in slabs of `max_rows` x
    `capacity` positions; the live cache is the first `rows` rows and the
    first `length` positions."""

    def __init__(self, capacity: int, max_rows: int) -> None:
        super().__init__()
        self.capacity, self.max_rows = capacity, max_rows
        self.length = self.rows = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.rows = key_states.shape[0]
        k_shape = (self.max_rows, key_states.shape[1], self.capacity, key_states.shape[-1])
        v_shape = (self.max_rows, value_states.shape[1], self.capacity, value_states.shape[-1])
        self._k, self._v = key_states.new_empty(k_shape), value_states.new_empty(v_shape)
        self.is_initialized = True

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
        self._k[: self.rows, :, self.length : end] = key_states
        self._v[: self.rows, :, self.length : end] = value_states
        self.length = end
        self._refresh()
        return self.keys, self.values

    def _refresh(self) -> None:
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
        if rows > self.rows:  # a prompt's cache copied to its samples: gather from a copy of the few source rows
            live_k, live_v = self.keys.clone(), self.values.clone()  # straight into the slab (no overlap)
            torch.index_select(live_k, 0, idx, out=self._k[:rows, :, : self.length])
            torch.index_select(live_v, 0, idx, out=self._v[:rows, :, : self.length])
        else:  # rows dropped: gather the fewer kept rows, then write them back
            picked_k, picked_v = self.keys.index_select(0, idx), self.values.index_select(0, idx)
            self._k[:rows, :, : self.length] = picked_k
            self._v[:rows, :, : self.length] = picked_v
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
        self._k[:rows, :, :length].zero_()
        self._v[:rows, :, :length].zero_()
        for row, k, v in pieces:
            n = k.shape[-2]
            self._k[row, :, length - n : length] = k
            self._v[row, :, length - n : length] = v
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
        for slab in (self._k, self._v):
            live = slab[:rows, :, : self.length]
            gather = idx[:, None, :, None].expand(rows, live.shape[1], width, live.shape[-1])
            slab[:rows, :, :width] = live.gather(2, gather)
        self.length = width
        self._refresh()

    def row_kv(self, row: int, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the live cache's keys and values of batch row `row` at `columns`."""
        live_k, live_v = self._k[row, :, : self.length], self._v[row, :, : self.length]
        return live_k.index_select(1, columns), live_v.index_select(1, columns)


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


def new_cache(model_config: Any, capacity: int, max_rows: int) -> Cache:
    """A slab cache of `max_rows` x `capacity` positions for models whose layers all use
    full attention; any other model (sliding windows, linear attention) gets
    the library's DynamicCache, which handles its layer types."""
    text_config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    if not slab_capable(model_config):
        return DynamicCache(config=model_config)
    return Cache(layers=[SlabLayer(capacity, max_rows) for _ in range(text_config.num_hidden_layers)])
