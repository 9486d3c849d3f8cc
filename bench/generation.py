"""Group sampling throughput of the hf engine: the prompt computed once and its
KV cache shared across the G samples, against repeating the prompt G times,
side by side in one run on the same model (and HF `generate` with
`num_return_sequences` for reference).

Both engine paths draw the same samples (same seeds), so their token counts
are equal and the ratio is a pure speed ratio. Process CPU time is reported
beside wall time: on a shared machine it is the steadier of the two.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/generation.py --preset tiny --prompts 32 --group 8

With `--demo N`, the demo's own rollout calls instead: configs/default.yaml's training loop runs
N steps on the embedded base, recording every rollout `generate` call (its requests and the
weights it ran with); each is then replayed by the engine before and after each cut, taking
turns at every call, in thread CPU ms per call, and the completions are checked identical
(token ids, log-probs, text):
- before: the KV slab copying a group's prompt cache to its samples by gathering the rows into
  a new tensor and writing that into the slab;
- after (now): gathering from a copy of the few prompt rows straight into the slab.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/generation.py --demo 60
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from dataclasses import dataclass

from common import quiet_run  # bench/common.py: this script runs with bench/ first on sys.path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def build_prompts(engine, count: int, seed: int) -> list[tuple[int, ...]]:
    """Chat prompts of 30-90 characters, like the procedural domains' tasks."""
    import random

    from posttrain.types import Message

    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        digits = " ".join(str(rng.randint(0, 999)) for _ in range(rng.randint(4, 18)))
        prompts.append(engine.encode_chat([Message("user", f"Sort these numbers ascending: {digits}")]))
    return prompts


@dataclass
class Timing:
    """Best wall and process-CPU seconds over the repeats, tokens per run."""

    wall: float = float("inf")
    cpu: float = float("inf")
    tokens: int = 0

    def add(self, wall: float, cpu: float, tokens: int) -> None:
        self.wall, self.cpu, self.tokens = min(self.wall, wall), min(self.cpu, cpu), tokens

    def show(self) -> str:
        return (
            f"{self.tokens / self.wall:7.0f} tok/s wall, {self.tokens / self.cpu:7.0f} tok/CPU-s ({self.tokens} tokens)"
        )


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def task_prompts(engine, names: list[str], count: int) -> list[tuple[int, ...]]:
    """Chat prompts of the named domains' train tasks at level 2 (round robin)."""
    from posttrain.domains.registry import get

    domains = [get(n) for n in names]
    return [engine.encode_chat(domains[i % len(domains)].sample(i, "train", 2).prompt) for i in range(count)]


def time_engine(engine, requests, repeats: int) -> Timing:
    timing = Timing()
    for _ in range(repeats):
        wall, cpu, groups = timed(lambda: engine.generate(requests))
        timing.add(wall, cpu, sum(len(c.token_ids) for g in groups for c in g))
    return timing


def time_hf_generate(model, tok, prompts, group: int, max_tokens: int, repeats: int) -> Timing:
    """HF generate, one call per batch of prompts, num_return_sequences=G."""
    import torch

    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + list(p) for p in prompts])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    ids, mask = ids.to(model.device), mask.to(model.device)
    timing = Timing()
    for _ in range(repeats):
        torch.manual_seed(0)
        with torch.inference_mode():
            wall, cpu, out = timed(
                lambda: model.generate(
                    ids,
                    attention_mask=mask,
                    do_sample=True,
                    top_k=0,
                    max_new_tokens=max_tokens,
                    num_return_sequences=group,
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=tok.eos_token_id,
                )
            )
        new = out[:, width:]
        ended = (new == tok.eos_token_id).int().cumsum(-1)
        timing.add(wall, cpu, int(((ended == 0) | ((ended == 1) & (new == tok.eos_token_id))).sum()))
    return timing


def reorder_as_was(self, beam_idx) -> None:
    """SlabLayer.reorder_cache before the cut: every reorder gathers into a new tensor, then
    writes it into the slab."""
    if not self.is_initialized:
        return
    rows = beam_idx.shape[0]
    idx = beam_idx.to(self._k.device)
    picked_k, picked_v = self.keys.index_select(0, idx), self.values.index_select(0, idx)
    self._k[:rows, :, : self.length] = picked_k
    self._v[:rows, :, : self.length] = picked_v
    self.rows = rows
    self._refresh()


def demo_main(steps: int) -> None:
    """The demo loop's rollout calls replayed by the engine before and after, side by side."""
    import statistics
    import tempfile

    import torch

    from posttrain.configs import load_config
    from posttrain.engine.hf import HFEngine
    from posttrain.engine.kvcache import SlabLayer
    from posttrain.loop import train
    from posttrain.model.arch import load_model
    from posttrain.model.pretrain import ensure_base

    torch.set_num_threads(1)
    recorded = []
    inner = HFEngine.generate

    def generate(self, requests):
        if requests and requests[0].params.n > 1:  # a rollout call (the evaluation's are n=1)
            recorded.append(({k: v.detach().clone() for k, v in self.model.state_dict().items()}, list(requests)))
        return inner(self, requests)

    with tempfile.TemporaryDirectory() as out:
        demo = os.path.join(os.path.dirname(__file__), "..", "configs", "default.yaml")
        cfg = load_config(demo, quiet_run(steps, out))
        HFEngine.generate = generate
        try:
            train(cfg, log=lambda *_: None)
        finally:
            HFEngine.generate = inner
    model_dir = cfg.model.path or ensure_base(cfg.base, progress=False)
    engines = {name: HFEngine(*load_model(model_dir), seed=cfg.run.seed) for name in ("before", "after")}
    now = SlabLayer.reorder_cache
    times = {name: [] for name in engines}
    same = True
    for i, (state, requests) in enumerate(recorded):
        got = {}
        for name, engine in engines.items():
            engine.model.load_state_dict(state)
            SlabLayer.reorder_cache = reorder_as_was if name == "before" else now
            t0 = time.thread_time()
            groups = engine.generate(requests)
            if i:  # the first call warms up
                times[name].append(time.thread_time() - t0)
            SlabLayer.reorder_cache = now
            got[name] = [(c.token_ids, c.logprobs, c.text) for g in groups for c in g]
        same = same and got["before"] == got["after"]
    rows = sum(r.params.n for r in recorded[0][1])
    print(f"the demo's rollout calls ({len(recorded)} recorded from configs/default.yaml, {rows} samples each;")
    print(f"{len(recorded) - 1} replayed per variant, taking turns), thread CPU ms per generate call;")
    print(f"identical completions (token ids, log-probs, text): {same}")
    print("| variant | median | mean | median / before |\n|---|---:|---:|---:|")
    med0 = statistics.median(times["before"])
    for name, t in times.items():
        print(
            f"| {name} | {statistics.median(t) * 1e3:.1f} | {statistics.mean(t) * 1e3:.1f} | "
            f"{statistics.median(t) / med0:.2f} |"
        )
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (the loop and both engines)")
    if not same:
        raise SystemExit("the engines' completions differ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", help="random model of this preset (when no --model)")
    ap.add_argument(
        "--model",
        default=None,
        help="a model directory (e.g. a pretrained base); prompts then "
        "come from the procedural domains' tasks, so completion lengths are realistic",
    )
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--domains", default="add,sub,mul,reverse,sort", help="task domains for --model prompts")
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--hf-generate", action="store_true", help="also time HF generate(num_return_sequences=G)")
    ap.add_argument("--demo", type=int, default=0, metavar="N", help="replay the demo loop's rollout calls (N steps)")
    args = ap.parse_args()
    if args.demo:
        demo_main(args.demo)
        return

    import torch

    from posttrain.engine.hf import HFEngine, HFEngineConfig
    from posttrain.model.arch import load_model, random_model
    from posttrain.types import GenerationRequest, SamplingParams

    if args.model:
        model, tok = load_model(args.model, device=args.device)
    else:
        model, tok = random_model(args.preset, seed=0)
    model.eval()
    shared = HFEngine(model, tok, device=args.device, config=HFEngineConfig(max_batch_rows=args.prompts * args.group))
    naive = HFEngine(model, tok, config=HFEngineConfig(max_batch_rows=args.prompts * args.group, prefix_sharing=False))
    prompts = (
        task_prompts(shared, args.domains.split(","), args.prompts)
        if args.model
        else build_prompts(shared, args.prompts, seed=0)
    )
    requests = [
        GenerationRequest(p, SamplingParams(max_tokens=args.max_tokens, n=args.group, seed=i))
        for i, p in enumerate(prompts)
    ]
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model {args.model or args.preset} ({params / 1e6:.2f}M params) on {shared.device}, {args.prompts} prompts x "
        f"G={args.group}, "
        f"prompt {min(map(len, prompts))}-{max(map(len, prompts))} tokens, max_tokens {args.max_tokens}, "
        f"best of {args.repeats}"
    )
    for threads in args.threads:
        torch.set_num_threads(threads)
        shared.generate(requests[:2])  # warm-up
        naive_t = time_engine(naive, requests, args.repeats)
        shared_t = time_engine(shared, requests, args.repeats)
        assert naive_t.tokens == shared_t.tokens, "the two paths must draw the same samples"
        print(f"threads {threads}: shared prefix   {shared_t.show()}")
        print(f"threads {threads}: repeated prompt {naive_t.show()}")
        print(
            f"threads {threads}: shared / repeated: {naive_t.wall / shared_t.wall:.2f}x wall, "
            f"{naive_t.cpu / shared_t.cpu:.2f}x CPU"
        )
        if args.hf_generate:
            hf_t = time_hf_generate(shared.model, tok, prompts, args.group, args.max_tokens, args.repeats)
            print(f"threads {threads}: HF generate(num_return_sequences=G) {hf_t.show()}")
            print(
                f"threads {threads}: shared / HF generate (tok/s): "
                f"{(shared_t.tokens / shared_t.wall) / (hf_t.tokens / hf_t.wall):.2f}x wall, "
                f"{(shared_t.tokens / shared_t.cpu) / (hf_t.tokens / hf_t.cpu):.2f}x CPU"
            )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
