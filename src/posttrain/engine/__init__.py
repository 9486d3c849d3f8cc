"""Inference engines: `hf` (in process) and `openai` (any OpenAI-compatible server)."""
