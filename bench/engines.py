"""The hf engine against the vllm engine on this machine, side by side in one run.

For each preset (random weights of the embedded architecture, tied embeddings, the embedded
tokenizer) it measures both engines on the same prompts, token budgets, groups and seeds:
  - start-up seconds: hf, loading the model directory and building the engine (in a child
    process of its own); vllm, `VLLMServer.start()` (export, process start, /health) plus
    the engine's first /v1/models call;
  - generation tokens/s (completion tokens produced / wall seconds of one `generate` call
    over all prompts), median and range over --repeats calls after one warm-up call;
  - peak RSS: hf, the child process's VmHWM; vllm, the sampled peak (every 0.2 s) of the
    summed RSS of the server's whole process tree (API server, engine core, worker), and
    the sum of each process's own VmHWM (an upper bound: their peaks need not coincide);
  - push latency per transport (`VLLMEngine.update_weights`: pause, load, prefix-cache
    reset, resume), median and range over --pushes: `reload` (a full checkpoint, in place)
    and `lora` (a rank-8 adapter, in place), each alternating between two different weight
    sets so every push changes the served weights; with the time `Trainer.save_weights`
    takes to write what the push loads. The hf engine shares the trained module, so its
    push is a version bump (no weights move). Pushing only the changed tensors is not a
    route of the vllm engine (vLLM's reload of a partial folder answers success and serves
    NaN, so the engine refuses one); it is reported as not available, not measured.
The vLLM server is started with LoRA enabled (rank 8) for both its generation and its
pushes, as the vllm engine starts it (on a CPU without chunked prefill: engine/vllm.py), plus
--vllm-args; generation asks for the
base model. hf runs with --threads torch threads (default
1, the project's run.threads); the vLLM CPU worker binds its own OpenMP threads (on a
2-core host vLLM's auto binding gives the worker one core and reserves the other for its
API server; the results record the binding from its log).

    .venv/bin/python bench/engines.py --presets tiny small medium
    .venv/bin/python bench/engines.py --presets tiny --repeats 1 --pushes 2   (a quick check)

Needs .venv-vllm (`make vllm-venv`). Writes --out (JSON) and prints a table.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("repeats", "pushes", "prompts", "group", "prompt_len", "max_tokens", "threads")
"""The arguments the results record."""


def requests(args: argparse.Namespace, vocab: int, eos: int) -> list[Any]:
    """The same prompts, budgets and seeds for both engines: --prompts random token-id prompts
    of --prompt-len tokens (no EOS among them), each a group of --group samples at T = 1."""
    import random

    from posttrain.types import GenerationRequest, SamplingParams

    rng = random.Random(0)
    ids = [i for i in range(vocab) if i != eos]
    return [
        GenerationRequest(
            tuple(rng.choice(ids) for _ in range(args.prompt_len)),
            SamplingParams(max_tokens=args.max_tokens, temperature=1.0, n=args.group, seed=1000 + i),
        )
        for i in range(args.prompts)
    ]


def timed_generate(engine: Any, reqs: list[Any], repeats: int) -> dict[str, Any]:
    """One warm-up call, then `repeats` timed calls: tokens/s of each."""
    engine.generate(reqs)
    rates, tokens = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = engine.generate(reqs)
        dt = time.perf_counter() - t0
        n = sum(len(c.token_ids) for g in out for c in g)
        rates.append(n / dt)
        tokens.append(n)
    return {"tokens_per_s": rates, "tokens": tokens}


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def vm_hwm_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- hf: a child process of its own (its peak RSS is the engine's alone) -------


def hf_child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    from posttrain.engine.hf import HFEngine
    from posttrain.model.arch import load_model

    model, tok = load_model(args.model, device="cpu")
    engine = HFEngine(model, tok, seed=0)
    startup = time.perf_counter() - t0
    gen = timed_generate(engine, requests(args, len(tok), int(tok.eos_token_id)), args.repeats)
    print(json.dumps({"startup_s": startup, **gen, "peak_rss_mb": vm_hwm_mb()}))


def run_hf(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--hf-child", "--model", str(model_dir), "--threads", str(args.threads)]
    cmd += ["--repeats", str(args.repeats), "--prompts", str(args.prompts), "--group", str(args.group)]
    cmd += ["--prompt-len", str(args.prompt_len), "--max-tokens", str(args.max_tokens)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if out.returncode != 0:
        raise SystemExit(f"hf child failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- vllm -------------------------------------------------------------------------


class TreeRSS:
    """Samples the summed RSS of a process and all its descendants every `every_s` seconds."""

    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        self.pid, self.every_s = pid, every_s
        self.peak_mb, self.hwm_mb, self.procs = 0.0, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> list[Any]:
        import psutil

        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(self.every_s):
            total, hwm, n = 0, 0.0, 0
            for p in self._tree():
                try:
                    total += p.memory_info().rss
                    hwm += vm_hwm_mb(p.pid)
                    n += 1
                except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
                    continue
            self.peak_mb = max(self.peak_mb, total / 2**20)
            self.hwm_mb, self.procs = max(self.hwm_mb, hwm), max(self.procs, n)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {"peak_rss_mb": self.peak_mb, "sum_vm_hwm_mb": self.hwm_mb, "processes": self.procs}


def weight_sets(model_dir: Path, work: Path) -> dict[str, list[tuple[Path, float]]]:
    """Two full checkpoints and two rank-8 adapters (each a different perturbation of the
    weights), written by `Trainer.save_weights` as a run writes them; with the write seconds."""
    import torch

    from posttrain.configs.trainer import LoraConfig, TrainerConfig
    from posttrain.model.arch import load_model
    from posttrain.trainer.trainer import Trainer

    out: dict[str, list[tuple[Path, float]]] = {"reload": [], "lora": []}
    for transport, lora in (("reload", None), ("lora", LoraConfig(rank=8, alpha=16))):
        model, _ = load_model(model_dir, device="cpu")
        trainer = Trainer(model, TrainerConfig(lora=lora))
        for i in range(2):
            with torch.no_grad():
                g = torch.Generator().manual_seed(i)
                for p in trainer.model.parameters():
                    if p.requires_grad:
                        p.add_(torch.randn(p.shape, generator=g) * 0.02)
            t0 = time.perf_counter()
            path = trainer.save_weights(work / f"{transport}-{i}")
            out[transport].append((Path(path), time.perf_counter() - t0))
    return out


def run_vllm(args: argparse.Namespace, model_dir: Path, work: Path) -> dict[str, Any]:
    from posttrain.configs.engine import VLLMConfig
    from posttrain.engine.vllm import VLLMEngine, VLLMServer
    from posttrain.model.arch import load_tokenizer

    tok = load_tokenizer(model_dir)
    sets = weight_sets(model_dir, work)
    server = VLLMServer(model_dir, work / "run", VLLMConfig(extra_args=tuple(args.vllm_args)), lora_rank=8)
    t0 = time.perf_counter()
    server.start()
    assert server.proc is not None
    rss = TreeRSS(server.proc.pid)
    try:
        engine = VLLMEngine(tok, server=server, seed=0, timeout_s=600, push_retries=0)
        startup = time.perf_counter() - t0
        gen = timed_generate(engine, requests(args, len(tok), int(tok.eos_token_id)), args.repeats)
        pushes: dict[str, Any] = {}
        for transport, paths in sets.items():
            times, parts = [], []
            for k in range(args.pushes + 1):  # the first push of each transport is a warm-up
                path = paths[k % 2][0]
                t1 = time.perf_counter()
                engine.update_weights(path)
                if k:
                    times.append(time.perf_counter() - t1)
                    parts.append(dict(getattr(engine, "last_push_s", {})))  # per call, where the engine records it
            engine.generate(requests(args, len(tok), int(tok.eos_token_id))[:1])  # it serves after the push
            pushes[transport] = {"load_s": times, "write_s": [w for _, w in paths], "calls_s": parts}
        log = server.log_path.read_text(errors="replace")
        keys = ("core ids=", "reserved_cpus")
        binding = [ln.split("]", 1)[-1].strip() for ln in log.splitlines() if any(k in ln for k in keys)]
    finally:
        mem = rss.stop()
        server.stop()
    return {"startup_s": startup, **gen, **mem, "pushes": pushes, "omp_binding": binding[:4]}


def preset_dir(preset: str, work: Path) -> Path:
    from posttrain.model.arch import random_model

    out = work / preset / "model"
    model, tok = random_model(preset, seed=0)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["tiny", "small", "medium"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pushes", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "engines.json")
    ap.add_argument(
        "--vllm-args",
        nargs="*",
        default=[],
        help="engine.vllm.extra_args of the server (the engine already starts a CPU server without chunked "
        "prefill, --max-num-batched-tokens the model's length: engine/vllm.py VLLMServer.command)",
    )
    ap.add_argument("--hf-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_child:
        hf_child(args)
        return 0
    from posttrain.engine.vllm import default_python

    if not default_python().exists():
        print(f"engines: no vLLM venv at {default_python()} (make vllm-venv)", file=sys.stderr)
        return 2
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_average_start": os.getloadavg(),
        "config": {**{k: getattr(args, k) for k in FIELDS}, "vllm_args": args.vllm_args},
        "presets": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        for preset in args.presets:
            model_dir = preset_dir(preset, Path(tmp))
            print(f"[{preset}] hf ...", flush=True)
            hf = run_hf(args, model_dir)
            print(f"[{preset}] vllm ...", flush=True)
            vl = run_vllm(args, model_dir, Path(tmp) / preset)
            results["presets"][preset] = {"hf": hf, "vllm": vl}
    results["load_average_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print_table(results)
    print(f"results: {args.out}")
    return 0


def print_table(results: dict[str, Any]) -> None:
    def med(xs: list[float], scale: float = 1.0, fmt: str = "{:.0f}") -> str:
        s = summary(xs)
        return f"{fmt.format(s['median'] * scale)} ({fmt.format(s['min'] * scale)}-{fmt.format(s['max'] * scale)})"

    print("\n| preset | engine | start-up s | gen tokens/s median (range) | peak RSS MiB | vllm/hf tokens/s |")
    print("|---|---|---:|---:|---:|---:|")
    for preset, r in results["presets"].items():
        hf, vl = r["hf"], r["vllm"]
        ratio = statistics.median(vl["tokens_per_s"]) / statistics.median(hf["tokens_per_s"])
        print(f"| {preset} | hf | {hf['startup_s']:.1f} | {med(hf['tokens_per_s'])} | {hf['peak_rss_mb']:.0f} | |")
        print(
            f"| {preset} | vllm | {vl['startup_s']:.1f} | {med(vl['tokens_per_s'])} | {vl['peak_rss_mb']:.0f} "
            f"(sum of VmHWM {vl['sum_vm_hwm_mb']:.0f}, {vl['processes']} processes) | {ratio:.2f}x |"
        )
    print("\n| preset | push | update_weights ms median (range) | per call ms (median) | write ms (2 writes) |")
    print("|---|---|---:|---|---:|")
    for preset, r in results["presets"].items():
        for transport, p in r["vllm"]["pushes"].items():
            writes = ", ".join(f"{w * 1000:.0f}" for w in p["write_s"])
            calls = {k: statistics.median(c[k] for c in p["calls_s"]) * 1000 for k in (p["calls_s"] or [{}])[0]}
            split = ", ".join(f"{k} {v:.0f}" for k, v in calls.items()) or "not recorded"
            print(f"| {preset} | {transport} | {med(p['load_s'], 1000)} | {split} | {writes} |")
        print(f"| {preset} | changed tensors only | not available (the vllm engine refuses a partial folder) | | |")
        print(f"| {preset} | hf (in process) | 0: the engine shares the trained module | | |")
    print(f"\nload average at start {results['load_average_start']}, at end {results['load_average_end']}")


if __name__ == "__main__":
    raise SystemExit(main())
