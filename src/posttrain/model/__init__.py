"""The embedded base model: a character-level tokenizer and a tiny Qwen2 causal LM
that posttrain builds and pretrains itself (no hub is reachable)."""
