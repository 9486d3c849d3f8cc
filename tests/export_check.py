"""Shared by the export portability tests (plain transformers: tests/trainer, vLLM: tests/engine)."""

from __future__ import annotations

from pathlib import Path


def domain_prompts() -> list[str]:
    """Two prompts of every built-in domain but reasoning-gym's (building its datasets takes
    ~10 s, and 14 of them hold non-ASCII characters, which the char-level tokenizer maps to
    <|unk|> and the portable one drops), chat-formatted as posttrain formats them."""
    from posttrain.domains.registry import all_domains
    from posttrain.model.tokenizer import build_tokenizer

    tok, out = build_tokenizer(), []
    for name, dom in sorted(all_domains().items()):
        if name.startswith("rg_"):
            continue
        for i in range(2):
            msgs = [{"role": m.role, "content": m.content} for m in dom.sample(i, "eval", 1).prompt]
            out.append(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))
    return out


def export_base(base: str | Path, tmp: Path) -> Path:
    """Save `base` as a full training checkpoint under `tmp` and `posttrain export` it to tmp/out."""
    from posttrain.cli import main
    from posttrain.configs.trainer import TrainerConfig
    from posttrain.model.arch import load_model
    from posttrain.trainer.trainer import Trainer

    model, tok = load_model(base)
    ckpt = Trainer(model, TrainerConfig()).save(tmp / "run", tok, {})
    assert main(["export", str(ckpt), "--out", str(tmp / "out")]) == 0
    return tmp / "out"
