"""What several bench scripts share. Imported by its folder name (a bench script runs with bench/
first on sys.path); no side effects on import: no environment variables, no torch."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any


def quiet_run(steps: int, out: str) -> list[str]:
    """Overrides of a demo loop run that only trains: a small held-out set, no periodic evaluation,
    pass@k, above-level set, checkpoint, report or progress bar; the run dir under `out`."""
    return [
        f"run.steps={steps}",
        "eval.tasks_per_domain=10",
        "eval.every_steps=0",
        "eval.samples=0",
        "eval.above_tasks=0",
        "run.checkpoint_every=0",
        "monitor.report=false",
        "run.progress=false",
        f"run.out_dir={out}",
    ]


def in_child(measure: Callable[[dict[str, Any]], dict[str, Any]], spec: dict[str, Any]) -> dict[str, Any]:
    """`measure(spec)` in a forked child, so each point has its own peak RSS; the result comes back
    through a pipe as JSON. A failure in the child stops the bench naming the point."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, write, leave without running the parent's cleanup
        os.close(read)
        try:
            out = json.dumps(measure(spec)).encode()
        except BaseException as e:  # noqa: BLE001 - the parent prints what failed
            out = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
        with os.fdopen(write, "wb") as f:
            f.write(out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(data) if data else {"error": "the child wrote nothing"}
    if "error" in result:
        raise SystemExit(f"point {spec} failed: {result['error']}")
    return result


_M_MMAP_THRESHOLD = -3


def map_large_allocations() -> None:
    """glibc's mmap threshold pinned at 64 KiB: every larger block is mapped and unmapped on its own,
    so a process's VmHWM (`status_kb`) counts what a measured call held, not the heap's high water."""
    import ctypes

    ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, 64 * 1024)


def status_kb(field: str) -> int:
    """A field of /proc/self/status in kB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak_kb() -> int:
    """Reset this process's VmHWM to its current RSS and return that RSS in kB: the base a measured
    call's `status_kb("VmHWM")` is read against."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kb("VmRSS")


def domain_levels(spec: str) -> dict[str, int]:
    """A bench's `--domains` value, `domain:level,...` (pyfunc_revise:1,ifeval:1), as {domain: level};
    SystemExit naming the value when it is not that."""
    try:
        out = {d.strip(): int(lv) for d, lv in (item.split(":") for item in spec.split(","))}
    except ValueError:
        raise SystemExit(f"--domains {spec!r}: expected domain:level,... (pyfunc_revise:1,ifeval:1)") from None
    if not all(out):
        raise SystemExit(f"--domains {spec!r}: a domain name is empty")
    return out


def dense_tower_optimizer(params: list[Any], lr: float, steps: int) -> tuple[Any, Any]:
    """AdamW (betas 0.9/0.95, weight decay 0.01) and its schedule for a `dense_tower_step` stage
    of `steps`: a linear warm-up over the first steps/20, then cosine decay (fit_masked_lm's)."""
    import math

    import torch

    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: min(1.0, (k + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, k / steps)))
    )
    return opt, sched


def dense_tower_step(
    tower: Any, head: Any, pixels: Any, targets: Any, params: list[Any], opt: Any, sched: Any
) -> tuple[Any, float]:
    """One step of a vision tower trained alone on a per-patch target (bench/vlm_reading.py's
    characters, bench/vlm_probe.py's words): `head` on the tower's last hidden states, cross-entropy
    against `targets` (class 0: nothing there, weighted 0.2, the rest 1), gradients clipped at 1.0,
    then `opt` and `sched` step. Returns the logits (targets' shape plus classes), detached, and
    the loss."""
    import torch

    hidden = tower(pixels, output_hidden_states=True).hidden_states[-1]
    logits = head(hidden).view(*targets.shape, -1)
    weight = torch.where(targets > 0, 1.0, 0.2).reshape(-1)
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    loss = (nll * weight).sum() / weight.sum()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()
    return logits.detach(), float(loss.item())


def vlm_model(spec: Any, tok: Any, tower: Any = (64, 2)) -> Any:
    """A fresh LlavaForConditionalGeneration of model/vision.py's config for `spec`, its vision
    tower `tower` = (width, depth) (intermediate 2 x width), the language model's positions
    widened to hold the image tokens and a prompt. Seeds are the caller's (torch.manual_seed)."""
    from transformers import LlavaForConditionalGeneration

    from posttrain.model import vision

    conf = vision.make_config(spec, tok)
    width, depth = tower
    conf.vision_config.hidden_size, conf.vision_config.intermediate_size = width, 2 * width
    conf.vision_config.num_hidden_layers = depth
    conf.text_config.max_position_embeddings = max(512, spec.image_tokens + 256)
    return LlavaForConditionalGeneration(conf)
