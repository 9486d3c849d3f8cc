"""Scale-out options of the one training code path: LoRA, FSDP2, bf16 autocast,
gradient checkpointing, memory-sized micro-batches, pinned RNG, remote weight sync.

Invariant: nothing here is a second trainer. `prepare_model` turns the
Trainer's options into changes of the model it trains (adapters, sharding,
checkpointing), and the Trainer's own step uses `memory` and `fsdp` helpers;
with every option off the Trainer computes exactly what it computed before.
Importing this package does not import torch; its modules do.
"""
