"""Supervised fine-tuning on chat demonstrations (`posttrain sft`): data (read, render, mask,
batch by length) and the run (AdamW steps, metrics, checkpoints, held-out before and after)."""
