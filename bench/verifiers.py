"""Verifier throughput per domain family: scores per second, one process.

Tasks are sampled first (not timed); then gold and wrong completions are
scored alternately and timed. Math answers that are not string-identical to
the reference go to the math-verify worker process (the wrong half here);
geo runs every script in the sandbox. Peak RSS at the end.

    .venv/bin/python bench/verifiers.py [--scale 1.0] [--byo-only]

Then the bring-your-own verifiers by name (posttrain.byo): scores/s of each on
gold and wrong answers, and an LLM judge (`posttrain serve` on a random micro
model, in this process, over loopback HTTP) with its score cache on and off.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

from posttrain.domains.registry import all_domains
from posttrain.types import Episode

FAMILIES = {
    "builtin (add/sub/mul/reverse/sort)": (lambda n: n in {"add", "sub", "mul", "reverse", "sort"}, 400),
    "rg_* (reasoning-gym)": (lambda n: n.startswith("rg_"), 2),
    "math_* (math-verify worker)": (lambda n: n.startswith("math_"), 4),
    "doc_* (documents)": (lambda n: n.startswith("doc_"), 10),
    "fin_* (financial statements)": (lambda n: n.startswith("fin_"), 10),
    "sql_* (SQLite, read-only)": (lambda n: n.startswith("sql_"), 6),
    "tool_* (JSON tool world)": (lambda n: n.startswith("tool_"), 10),
    "geo_* (sandboxed mesh scripts)": (lambda n: n.startswith("geo_"), 1),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="multiply tasks per domain")
    ap.add_argument("--byo-only", action="store_true", help="only the bring-your-own verifiers")
    args = ap.parse_args()
    if not args.byo_only:
        families(args)
    byo(args)
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


def families(args: argparse.Namespace) -> None:
    domains = all_domains()
    print(f"{'family':<38} {'domains':>7} {'scores':>7} {'scores/s':>9} {'gold/s':>8} {'wrong/s':>8}")
    for family, (pick, per_domain) in FAMILIES.items():
        names = [n for n in domains if pick(n)]
        k = max(1, round(per_domain * args.scale))
        work = []
        for n in names:
            d = domains[n]
            for i in range(k):
                t = d.sample(i, "train", 1 + i % d.levels)
                work.append((d, t, Episode(d.gold(t)), Episode(d.wrong(t))))
        for d, t, g, _ in work[:1]:  # warm workers and imports, untimed
            d.score(t, g)
        times = {"gold": 0.0, "wrong": 0.0}
        for d, t, g, w in work:
            for kind, ep in (("gold", g), ("wrong", w)):
                start = time.perf_counter()
                d.score(t, ep)
                times[kind] += time.perf_counter() - start
        total = times["gold"] + times["wrong"]
        print(
            f"{family:<38} {len(names):>7} {2 * len(work):>7} {2 * len(work) / total:>9.1f} "
            f"{len(work) / times['gold']:>8.1f} {len(work) / times['wrong']:>8.1f}"
        )


def _task(answer, prompt="12-3=", **metadata):
    from posttrain.byo.domain import RowRef
    from posttrain.types import Message, Task, TaskMeta

    return Task("b:1", "b", (Message("user", prompt),), RowRef(answer, metadata), TaskMeta("train", 1, "bench", "v"))


def _rate(verifier, cases, n):
    for t, g, _ in cases[:1]:
        verifier.score(t, g)  # warm workers, imports, models: untimed
    start = time.perf_counter()
    done = 0
    while done < n:
        for t, g, w in cases:
            verifier.score(t, g)
            verifier.score(t, w)
            done += 2
    return done / (time.perf_counter() - start)


def byo(args: argparse.Namespace) -> None:
    import os
    import sys
    import tempfile

    from posttrain.byo.verifiers import build_verifier
    from posttrain.configs.byo import VerifierSpec

    tmp = tempfile.mkdtemp(prefix="bench-byo-")
    with open(os.path.join(tmp, "bench_rewards.py"), "w") as fh:
        fh.write("def score(completion, answer):\n    return completion.strip() == str(answer)\n")
    sys.path.insert(0, tmp)
    os.chdir(tmp)
    setup = "CREATE TABLE t (x INTEGER, y TEXT); " + " ".join(f"INSERT INTO t VALUES ({i}, 'v{i}');" for i in range(50))
    ep = lambda text: Episode(text)  # noqa: E731
    specs = {
        "exact": ({"name": "exact"}, "Paris", "<answer>Paris</answer>", "<answer>Lyon</answer>"),
        "numeric": ({"name": "numeric", "tolerance": 0.01}, "3.14", "<answer>3.14</answer>", "<answer>2.7</answer>"),
        "choice": ({"name": "choice"}, "C", "The answer is (C)", "The answer is (B)"),
        "regex": ({"name": "regex"}, r"\d{3}-\d{4}", "<answer>555-1234</answer>", "<answer>55-1234</answer>"),
        "math (math-verify worker)": ({"name": "math"}, "\\frac{1}{2}", "<answer>0.5</answer>", "<answer>1/3</answer>"),
        "json": (
            {"name": "json"},
            {"name": "Ada", "age": 36},
            '{"name": "Ada", "age": 36}',
            '{"name": "Bo", "age": 36}',
        ),
        "sql (in-memory SQLite)": (
            {"name": "sql", "setup_field": "setup"},
            "SELECT y FROM t WHERE x > 40",
            "<answer>SELECT y FROM t WHERE x >= 41</answer>",
            "<answer>SELECT y FROM t</answer>",
        ),
        "composite (exact + regex)": (
            {"name": "composite", "parts": [{"verifier": "exact"}, {"verifier": {"name": "regex", "pattern": "^.*$"}}]},
            "42",
            "<answer>42</answer>",
            "<answer>41</answer>",
        ),
        "python (worker process)": ({"name": "python", "path": "bench_rewards:score"}, "9", "9", "8"),
    }
    n = max(20, round(400 * args.scale))
    print(f"\n{'byo verifier (by name)':<38} {'scores':>7} {'scores/s':>9}")
    for label, (spec, answer, good, bad) in specs.items():
        v = build_verifier(VerifierSpec.model_validate(spec))
        cases = [(_task(answer, setup=setup), ep(good), ep(bad))]
        k = (
            n // 10 if label.startswith(("math", "python")) else n if label.startswith("sql") else 50 * n
        )  # cheap ones: enough calls to time
        print(f"{label:<38} {k:>7} {_rate(v, cases, k):>9.1f}")
        getattr(v, "close", lambda: None)()
    tests = [{"args": [i, 0, 10], "expected": max(0, min(i, 10))} for i in (-3, 5, 12)]
    code = build_verifier(VerifierSpec.model_validate({"name": "code", "entry": "clamp"}))
    good = Episode("```python\ndef clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n```")
    bad = Episode("```python\ndef clamp(x, lo, hi):\n    return x\n```")
    k = max(10, n // 20)
    try:
        print(f"{'code (3 tests per row, sandbox)':<38} {k:>7} {_rate(code, [(_task(tests), good, bad)], k):>9.1f}")
    except Exception as exc:  # noqa: BLE001 - no sandbox backend on this machine
        print(f"{'code (3 tests per row, sandbox)':<38} skipped: {exc}")
    rm = _reward_model(tmp)
    v = build_verifier(VerifierSpec.model_validate({"name": "reward_model", "path": rm}))
    print(
        f"{'reward_model (micro, CPU, 1 thread)':<38} {n // 4:>7} "
        f"{_rate(v, [(_task('9'), ep('9'), ep('x'))], n // 4):>9.1f}"
    )
    _judge(tmp, n)


def _reward_model(tmp: str) -> str:
    import torch
    from transformers import Qwen2ForSequenceClassification

    from posttrain.model.arch import make_config
    from posttrain.model.tokenizer import build_tokenizer

    torch.manual_seed(0)
    torch.set_num_threads(1)
    tok = build_tokenizer()
    cfg = make_config("micro", len(tok), tok.pad_token_id, tok.eos_token_id)
    cfg.num_labels = 1
    path = os.path.join(tmp, "rm")
    Qwen2ForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _judge(tmp: str, n: int) -> None:
    import threading

    import uvicorn

    from posttrain.byo.verifiers import build_verifier
    from posttrain.configs.base import BaseConfig
    from posttrain.configs.byo import VerifierSpec
    from posttrain.configs.serve import ServeConfig
    from posttrain.model.arch import random_model
    from posttrain.model.pretrain import default_dir
    from posttrain.serve.server import build_server

    path = str(default_dir(BaseConfig()))  # the embedded base answers `a-b=` with digits: its first digit is the grade
    if not os.path.isfile(os.path.join(path, "config.json")):
        model, tok = random_model("micro", 0)
        path = os.path.join(tmp, "judge-model")
        model.save_pretrained(path)
        tok.save_pretrained(path)
    server = uvicorn.Server(
        uvicorn.Config(
            build_server(ServeConfig(model=path, canary={"probe_domains": []})),
            host="127.0.0.1",
            port=0,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1"
    base = {
        "name": "judge",
        "base_url": url,
        "rubric": "{completion}{prompt}",
        "score_pattern": r"(\d)",
        "scale": 9,
        "max_tokens": 4,
    }
    k = max(10, n // 10)
    cases = [(_task(str(i)), Episode(f"{i}"), Episode(f"{i}x")) for i in range(k // 2)]
    for label, cache in (
        ("judge, cache off (HTTP each score)", False),
        ("judge, cache on, all misses", os.path.join(tmp, "miss.sqlite")),
        ("judge, cache on, all hits", os.path.join(tmp, "miss.sqlite")),
    ):
        v = build_verifier(VerifierSpec.model_validate({**base, "cache": cache}))
        rate, failed = _safe_rate(v, cases)
        print(f"{label:<38} {len(cases) * 2:>7} {rate:>9.1f}   ({failed} replies without a score)")
    server.should_exit = True
    thread.join(timeout=30)


def _safe_rate(v, cases) -> tuple[float, int]:
    """Scores/s counting judge failures (a reply with no score) as calls made: they cost the same HTTP round trip."""
    start, done, failed = time.perf_counter(), 0, 0
    for t, g, w in cases:
        for e in (g, w):
            try:
                v.score(t, e)
            except Exception:  # noqa: BLE001 - counted like a score: the call was made
                failed += 1
            done += 1
    return done / (time.perf_counter() - start), failed


if __name__ == "__main__":
    main()
