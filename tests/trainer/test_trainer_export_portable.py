"""An export loads correctly in plain transformers, outside posttrain's code.

The fault this pins: AutoTokenizer resolves a folder whose config.json says qwen2 to
Qwen2Tokenizer, whatever tokenizer_config.json names, and that class rebuilds the
tokenizer from the vocabulary alone inside Qwen2's ByteLevel pipeline; the
char-level vocabulary had ' ' and '\\n', not their ByteLevel forms, so every space
and newline vanished (`rev kgb=` was 7 ids, not 8) and greedy answers went wrong
silently. The saved tokenizer.json is now in the byte-level form that rebuild keeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from export_check import domain_prompts as _prompts
from export_check import export_base
from posttrain.model.arch import load_model
from posttrain.model.tokenizer import build_tokenizer, make_portable

# Each plain-transformers subprocess imports torch and transformers (5-30 s under load).
pytestmark = pytest.mark.heavy

# Plain transformers only: posttrain is not importable from this script's path.
PLAIN = r"""
import json, sys
sys.path = [p for p in sys.path if "posttrain" not in p and not p.endswith("src")]
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, prompts, new = sys.argv[1], json.loads(sys.stdin.read()), int(sys.argv[2])
assert "posttrain" not in sys.modules
tok = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder).eval()
out = {"class": type(tok).__name__, "ids": [], "greedy": []}
for p in prompts:
    ids = tok.encode(p)
    out["ids"].append(ids)
    with torch.no_grad():
        g = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, pad_token_id=tok.pad_token_id)
    out["greedy"].append(tok.decode(g[0, len(ids):], skip_special_tokens=True))
print(json.dumps(out))
"""


def _plain(folder, prompts: list[str], new: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", PLAIN, str(folder), str(new)],
        input=json.dumps(prompts),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def exported(micro_base, tmp_path_factory):
    return export_base(micro_base, tmp_path_factory.mktemp("export"))


def test_plain_transformers_gets_posttrains_ids_and_greedy_answers(exported):
    prompts = ["rev kgb=", "sort 975=", "a b\n\tc"] + _prompts()
    plain = _plain(exported, prompts, new=4)
    model, tok = load_model(exported)
    built = build_tokenizer()
    assert len(plain["ids"][0]) == 8
    for p, ids, answer in zip(prompts, plain["ids"], plain["greedy"], strict=True):
        assert ids == tok.encode(p) == built.encode(p), p
        with torch.no_grad():
            g = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
        assert answer == tok.decode(g[0, len(ids) :], skip_special_tokens=True), p


def test_an_old_char_level_folder_is_made_portable(micro_base, tmp_path):
    """A folder saved before (a cached base, an old checkpoint) is rewritten by export."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(micro_base, old)
    build_tokenizer().save_pretrained(old)  # the char-level tokenizer.json as it used to be saved
    assert _plain(old, ["rev kgb="], new=1)["ids"] != [build_tokenizer().encode("rev kgb=")]
    assert make_portable(old) and not make_portable(old)
    assert _plain(old, ["rev kgb="], new=1)["ids"] == [build_tokenizer().encode("rev kgb=")]
