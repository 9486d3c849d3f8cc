"""A KV cache in preallocated slabs for the hf engine's decoding loop.

Invariant: each layer's `keys`/`values` are views of the first `length`
positions of a slab of fixed capacity, so appending a token writes one
column instead of copying the whole cache (DynamicCache concatenates every
step); `reorder_cache(index)` selects, repeats or drops batch rows, and is
how a group's prompt cache is copied to its samples.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class SlabLayer(DynamicLayer):
    """One attention layer's keys and values, in slabs of `capacity` positions."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        batch, heads, _, dim = key_states.shape
        self._k = key_states.new_empty((batch, heads, self.capacity, dim))
        self._v = value_states.new_empty((batch, value_states.shape[1], self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV slab full: {end} positions > capacity {self.capacity}")
        self._k[:, :, self.length:end] = key_states
        self._v[:, :, self.length:end] = value_states
        self.length = end
        self._refresh()
        return self.keys, self.values

    def _refresh(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.is_initialized:
            self._k = self._k.index_select(0, beam_idx.to(self._k.device))
            self._v = self._v.index_select(0, beam_idx.to(self._v.device))
            self._refresh()


def new_cache(model_config: Any, capacity: int) -> Cache:
    """A slab cache of `capacity` positions for models whose layers all use
    full attention; any other model (sliding windows, linear attention) gets
    the library's DynamicCache, which handles its layer types."""
    text_config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    layer_types = getattr(text_config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return DynamicCache(config=model_config)
    return Cache(layers=[SlabLayer(capacity) for _ in range(text_config.num_hidden_layers)])
