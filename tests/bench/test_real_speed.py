"""bench/real_speed.py's pure parts: the FLOP formulas (against a token-by-token count), the model
shape read from a config, the rate range and the table. The measurements themselves load the real
model and are run by hand (bench/RESULTS.md)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from bench_loader import load

ROOT = Path(__file__).resolve().parents[2]


rs = load("real_speed")

SMOL = SimpleNamespace(
    num_attention_heads=9, hidden_size=576, vocab_size=49152, num_hidden_layers=30, tie_word_embeddings=True
)
"""SmolLM2-135M's config, as far as the formulas read it."""
SMOL_PARAMS = 134_515_008


def _by_token(shape, start: int, count: int, scored: int) -> float:
    """The forward's FLOP summed token by token: body, attention over pos + 1 keys, the head."""
    total = 0.0
    for pos in range(start, start + count):
        total += 2 * shape.body + 4 * shape.layers * shape.attn_width * (pos + 1)
    return total + 2 * shape.head * scored


def test_shape_of_smollm2() -> None:
    shape = rs.Shape.of(SMOL, SMOL_PARAMS)
    assert shape.attn_width == 576
    assert shape.head == 49152 * 576
    assert shape.body == SMOL_PARAMS - 49152 * 576  # the tied embedding is counted once, as the head
    untied = rs.Shape.of(SimpleNamespace(**{**vars(SMOL), "tie_word_embeddings": False}), SMOL_PARAMS)
    assert untied.body == SMOL_PARAMS - 2 * 49152 * 576


def test_head_dim_from_config_wins() -> None:
    shape = rs.Shape.of(SimpleNamespace(**vars(SMOL), head_dim=32), SMOL_PARAMS)
    assert shape.attn_width == 9 * 32


@pytest.mark.parametrize(("start", "count", "scored"), [(0, 1, 1), (0, 37, 0), (50, 128, 128), (7, 0, 3)])
def test_forward_flops_equal_the_token_by_token_sum(start: int, count: int, scored: int) -> None:
    shape = rs.Shape.of(SMOL, SMOL_PARAMS)
    assert rs.forward_flops(shape, start, count, scored) == pytest.approx(_by_token(shape, start, count, scored))


def test_generation_flops_count_each_prompt_once_and_every_row() -> None:
    shape = rs.Shape.of(SMOL, SMOL_PARAMS)
    got = rs.generation_flops(shape, [40, 45], samples=4, new_tokens=128)
    want = sum(_by_token(shape, 0, p, 1) + 4 * _by_token(shape, p, 128, 128) for p in (40, 45))
    assert got == pytest.approx(want)
    # about 2 x parameters per generated token, plus attention: within 15% here
    per_token = got / (2 * 4 * 128)
    assert 2 * SMOL_PARAMS < per_token < 1.15 * 2 * SMOL_PARAMS


def test_train_step_flops_full_is_three_forwards_and_lora_two_plus_adapters() -> None:
    shape = rs.Shape.of(SMOL, SMOL_PARAMS)
    prompts, group, comp = [60, 64], 4, 180
    fwd = sum(_by_token(shape, 0, p, 0) + group * _by_token(shape, p, comp - 1, comp) for p in prompts)
    assert rs.train_step_flops(shape, prompts, group, comp, None) == pytest.approx(3 * fwd)
    forwarded = sum(prompts) + group * len(prompts) * (comp - 1)
    lora = rs.train_step_flops(shape, prompts, group, comp, 4_000_000)
    assert lora == pytest.approx(2 * fwd + 6 * 4_000_000 * forwarded)
    # full fine-tuning: about 6 x parameters per forwarded token
    assert (
        6 * SMOL_PARAMS * 0.8 < rs.train_step_flops(shape, prompts, group, comp, None) / forwarded < 6.6 * SMOL_PARAMS
    )


def test_matmul_flops_and_rate_range() -> None:
    assert rs.matmul_flops(2048) == 2 * 2048**3
    best, span = rs.rate_range(100, [2.0, 1.0, 4.0])
    assert best == 100.0
    assert span == "25.0-100.0"
    assert rs.rate_range(10, [2.0]) == (5.0, "")


def test_table_shows_fraction_of_peak_rss_and_reasons() -> None:
    rows = [
        rs.Row("matmul peak", "", gflops=80.0, peak_rss_mb=300.0, note="fp32"),
        rs.Row("hf engine", "4 x 4", 123.45, "100.0-123.5", 20.0, 1234.0, "2048 tokens a call"),
        rs.Row("vllm engine (CPU build)", "1", note="the vLLM server did not start: no / here"),
    ]
    text = rs.table(rows, peak=80.0).splitlines()
    assert text[0].startswith("| measurement | batch | tokens/s")
    assert text[2] == "| matmul peak |  |  | 80.0 | 100.0% | 300 | fp32 |"
    assert text[3] == "| hf engine | 4 x 4 | 123.5 (100.0-123.5) | 20.0 | 25.0% | 1,234 | 2048 tokens a call |"
    assert text[4] == "| vllm engine (CPU build) | 1 |  |  |  |  | the vLLM server did not start: no / here |"
    assert rs.fraction(10.0, None) == ""


def test_rows_of_an_error_keep_the_reason_in_one_cell() -> None:
    args = SimpleNamespace(prompts=4, group=4, lora_rank=16, peak_n=2048, peak_repeats=5)
    (row,) = rs.rows_of("train-full", {"error": "exit 1: out of memory\nline | two"}, args)
    assert (row.name, row.batch) == ("train step, full", "4 x 4")
    assert "\n" not in row.note and "|" not in row.note
    assert row.tokens_per_s is None


def test_rows_of_the_turn_taking_pair_give_the_cpu_ratio() -> None:
    args = SimpleNamespace(prompts=4, group=4, lora_rank=16, peak_n=2048, peak_repeats=5)
    one = {"tokens_per_s": 90.0, "range": "", "gflops": 3.0}
    res = {
        "hf": {**one, "tokens_per_cpu_s": 50.0},
        "generate": {**one, "tokens_per_cpu_s": 40.0},
        "vm_hwm_mb": 900.0,
    }
    hf, gen = rs.rows_of("hf-vs-generate", res, args)
    assert (hf.name, gen.name) == ("hf engine (turns)", "transformers generate (turns)")
    assert hf.note.endswith("50.0 tokens/CPU-s = 1.25x generate's")
    assert gen.note.endswith("40.0 tokens/CPU-s")
    assert hf.peak_rss_mb == 900.0 and hf.batch == "4 x 4"


def test_a_bf16_row_is_a_fraction_of_the_bf16_peak() -> None:
    rows = [
        rs.Row("matmul peak, fp32", "", gflops=80.0, note="fp32"),
        rs.Row("matmul peak, bf16", "", gflops=200.0, note="bf16", peak_of="bf16"),
        rs.Row("hf engine, bf16 copy", "1", 30.0, "", 20.0, 900.0, "x", peak_of="bf16"),
        rs.Row("hf engine", "1", 20.0, "", 20.0, 900.0, "y"),
    ]
    text = rs.table(rows, peak=80.0, peaks={"bf16": 200.0}).splitlines()
    assert [line.split(" | ")[4] for line in text[2:]] == ["100.0%", "100.0%", "10.0%", "25.0%"]
    assert rs.table(rows[2:3], peak=80.0).splitlines()[2].split(" | ")[4] == ""  # no bf16 peak measured: no fraction
