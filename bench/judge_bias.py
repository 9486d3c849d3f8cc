"""Judges with measured bias: the run-start checks on a fair and a biased judge, side by side.

Both judges are `posttrain serve --policy` processes (examples/rule_judges.py: `fair` grades
correctness only; `biased` gives 10 to verbose answers and, pairwise, prefers the first answer
unless one is over three times longer). The checks (posttrain.monitor.judges.check_judge, what
`posttrain train` runs at start) score `--items` rows of examples/data/subtraction.jsonl, four
items per row, labelled by the `exact` verifier. Printed per judge and mode: agreement with the
labels and its 95% Wilson interval, length bias, position-swap disagreement, the checks that fire,
judge calls per second; then a fair+biased ensemble's mean agreement on the same kind of items;
peak RSS at the end.

    .venv/bin/python bench/judge_bias.py [--items 50]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from posttrain.byo.domain import SourceDomain  # noqa: E402
from posttrain.configs.byo import JudgeChecks, SourceConfig, VerifierSpec  # noqa: E402
from posttrain.monitor.judges import check_judge  # noqa: E402
from posttrain.types import Episode  # noqa: E402
from serve_process import posttrain_serve  # noqa: E402  (tests/: the real-server helper)

RUBRICS = {
    "pointwise": "Question: {prompt}\nAnswer: {completion}\nGrade 0-10.",
    "pairwise": "Question: {prompt}\nAnswer A: {first}\nAnswer B: {second}\nWhich answer is right? Say A, B or TIE.",
}


def judge(url: str, mode: str) -> dict:
    return {"base_url": url, "rubric": RUBRICS[mode], "mode": mode, "cache": False, "retries": 0}


def domain(spec: dict) -> SourceDomain:
    source = SourceConfig.model_validate(
        {"path": str(ROOT / "examples/data/subtraction.jsonl"), "fields": {"prompt": "question", "answer": "answer"}}
    )
    return SourceDomain("judged", source, VerifierSpec.model_validate(spec))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=50, help="train rows checked (four items each)")
    args = ap.parse_args()
    checks = {"labels": {"name": "exact"}, "items": args.items}
    env = {"PYTHONPATH": str(ROOT / "examples"), "POSTTRAIN_CACHE": tempfile.mkdtemp()}
    with (
        posttrain_serve(None, env=env, policy="rule_judges:fair") as (fair, _),
        posttrain_serve(None, env=env, policy="rule_judges:biased") as (biased, _),
    ):
        urls = {"fair": fair + "/v1", "biased": biased + "/v1"}
        print(f"{'judge':<8}{'mode':<11}{'items':>6}  agreement [95% CI]   length bias  swap disagr.  calls/s  fired")
        for mode in ("pointwise", "pairwise"):
            for name, url in urls.items():
                dom = domain({"name": "judge", **judge(url, mode), "checks": checks})
                t0 = time.perf_counter()
                got = check_judge(dom, 1)
                dt = time.perf_counter() - t0
                assert got is not None
                calls = got.items * (2 if mode == "pairwise" else 1)
                swap = "n/a" if got.swap_disagreement is None else f"{got.swap_disagreement:.3f}"
                print(
                    f"{name:<8}{mode:<11}{got.items:>6}  {got.agreement:.3f} [{got.agreement_low:.3f}, "
                    f"{got.agreement_high:.3f}]  {got.length_bias:>+11.3f}  {swap:>12}  {calls / dt:>7.0f}  "
                    f"{', '.join(got.fired) or '-'}"
                )
        ens = domain(
            {"name": "judge_ensemble", "judges": [judge(urls["fair"], "pointwise"), judge(urls["biased"], "pointwise")]}
        )
        labels = domain({"name": "exact"}).verifier
        agreements = []
        for i in range(args.items):
            task = ens.sample(i, "train", 1)
            for text in (labels.gold(task), labels.wrong(task)):
                for padded in (False, True):
                    pad = JudgeChecks.model_fields["padding"].default
                    s = ens.score(task, Episode(pad + text if padded else text))
                    agreements.append(s.parts["agreement"])
        mean = sum(agreements) / len(agreements)
        print(f"ensemble fair+biased (pointwise): mean agreement {mean:.3f} over {len(agreements)} items")
    rss = [resource.getrusage(who).ru_maxrss / 1024 for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    print(f"peak RSS {rss[0]:.0f} MiB (this process), {rss[1]:.0f} MiB (largest judge server)")


if __name__ == "__main__":
    main()
