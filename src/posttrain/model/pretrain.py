"""Build the embedded base model: a tiny Qwen2 pretrained on synthetic text of
the built-in domains.

Invariant: the build is a pure function of its `BaseConfig` (seed included),
and it only ever sees train-split tasks, so held-out eval stays unseen. A
share `buggy_fraction` of the examples comes from the buggy solvers of
`posttrain.model.bugs`: the base is partly right, far from perfect, and
wrong in ways RL can fix. A config with RoPE scaling is not pretrained: its base is the
weights of the same config without scaling, saved with the scaling (`scaled_base`).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posttrain.configs.base import BaseConfig
from posttrain.model.bugs import BUGS, TURN_BUGS, TurnBug

DEFAULT_CACHE = Path(os.environ.get("POSTTRAIN_CACHE", Path.home() / ".cache" / "posttrain"))


DIGEST_EXAMPLES = 256
"""Conversations of the corpus that `data_digest` reads."""


def default_dir(cfg: BaseConfig) -> Path:
    return DEFAULT_CACHE / f"base-{cfg.preset}-{cfg.fingerprint()}"


BUILDS = "builds.jsonl"
"""In the cache folder: one line per base built there (name, preset, steps, seconds, when)."""


def _builds() -> list[dict]:
    path = DEFAULT_CACHE / BUILDS
    out = []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else ():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("seconds"), int | float):
            out.append(row)
    return out


def last_build(cfg: BaseConfig) -> tuple[float, str] | None:
    """How long building `cfg`'s base took on this machine: (seconds, "") from its last build
    here (the cache folder's log, else the record beside a cached copy), or (seconds, why) an
    estimate from the newest build of the same preset, domains (and levels) and batch size scaled
    by steps; None when nothing of its kind was built (a step's cost follows its examples' length:
    configs/long.yaml's 1,000-character examples cost about 60x the demo's 15-character ones)."""
    out = default_dir(cfg)
    rows = _builds()
    own = [r for r in rows if r.get("base") == out.name]
    if own:
        return float(own[-1]["seconds"]), ""
    try:
        info = json.loads((out / "posttrain_base.json").read_text())
        return float(info.get("build_seconds") or info["pretrain_seconds"]), ""
    except (OSError, ValueError, KeyError, TypeError):
        pass
    kind = {"preset": cfg.preset, "domains": cfg.domains, "batch_size": cfg.batch_size}
    alike = [
        r
        for r in rows
        if all(r.get(k) == v for k, v in kind.items()) and isinstance(r.get("steps"), int) and r["steps"] > 0
    ]
    if alike:
        r = alike[-1]
        return r["seconds"] * cfg.steps / r["steps"], (
            f"estimated from a {r['steps']}-step build of preset {cfg.preset} on the same domains"
        )
    return None


def duration(seconds: float) -> str:
    """38s, 4m52s, 1h02m."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def build_note(cfg: BaseConfig) -> str:
    """What the last build of `cfg`'s base took here, in words (`last_build`); a base with RoPE
    scaling is the unscaled base's weights (`scaled_base`), so its note is that one's."""
    if cfg.rope_scaling is not None:
        plain = cfg.unscaled()
        source = "cached" if is_cached(plain) else f"built first: {build_note(plain)}"
        return f"the weights of {default_dir(plain).name} ({source}) with {cfg.rope_scaling.type} RoPE scaling"
    last = last_build(cfg)
    if last is None:
        return f"not built on this machine before ({cfg.steps} pretraining steps of preset {cfg.preset})"
    seconds, why = last
    return f"about {duration(seconds)}, {why}" if why else f"the last build took {duration(seconds)}"


def data_digest(cfg: BaseConfig) -> str:
    """What a build trains on beyond its config: the first DIGEST_EXAMPLES conversations the
    corpus generator gives for `cfg` (the domains' task generators, gold answers, buggy solvers
    and policies), the embedded tokenizer (vocabulary, chat template) and the architecture
    preset. The config names the cache directory (`default_dir`); this digest, stored beside
    the weights, tells `ensure_base` when code changed what that config builds."""
    import hashlib

    from posttrain.model.arch import PRESETS
    from posttrain.model.tokenizer import build_tokenizer

    tok = build_tokenizer()
    corpus = _examples(cfg, random.Random(f"data-digest:{cfg.seed}"), play_limit=DIGEST_PLAYED)(DIGEST_EXAMPLES)
    text = json.dumps([PRESETS.get(cfg.preset), sorted(tok.get_vocab().items()), tok.chat_template, corpus])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


DIGEST_PLAYED = 8
"""Transcripts of each pooled domain (`Domain.pretrain_pool`) that `data_digest` plays through the
environment; its other draws of that domain enter the digest as their (slot, level, buggy) keys."""

Conversation = list[tuple[str, str]]
"""(role, content) messages; the loss covers the assistant ones."""


_POOL: dict[tuple[str, int, int, bool], Conversation] = {}
"""Transcripts of pooled domains (`Domain.pretrain_pool`) played so far in this process, by
(domain, slot, level, buggy): a base build and its `data_digest` share them."""


def _examples(
    cfg: BaseConfig, rng: random.Random, play_limit: int | None = None
) -> Callable[[int], list[Conversation]]:
    """The corpus of `cfg`, batch by batch. `play_limit` (the digest's use): only the first that
    many distinct (slot, level, buggy) keys of each pooled domain are transcripts; a draw of any
    other key is that key alone, so the digest never depends on what this process played before."""
    from posttrain.domains.registry import get

    domains = {name: (get(name), level) for name, level in cfg.domains.items()}
    names = sorted(domains)
    counter = {"i": 0}
    digest_keys: dict[str, list[tuple[str, int, int, bool]]] = {}

    def batch(n: int) -> list[Conversation]:
        out = []
        for _ in range(n):
            name = rng.choice(names)
            domain, top = domains[name]
            level = rng.randint(1, top)
            if domain.pretrain_pool and name in TURN_BUGS:
                # a pooled domain: slot k of N is train task k, gold or buggy as drawn now;
                # the same (slot, level, buggy) is played once per process
                slot = rng.randrange(domain.pretrain_pool)
                buggy = rng.random() < cfg.buggy_fraction
                key = (name, slot, level, buggy)
                if play_limit is not None:  # the digest: the first `play_limit` distinct keys, whatever was played
                    seen = digest_keys.setdefault(name, [])
                    if key not in seen and len(seen) >= play_limit:
                        out.append([("key", repr(key))])
                        continue
                    if key not in seen:
                        seen.append(key)
                if key not in _POOL:
                    task = domain.sample(slot, "train", level)
                    _POOL[key] = transcript(domain, task, TURN_BUGS[name] if buggy else None)
                out.append(_POOL[key])
                continue
            task = domain.sample(counter["i"], "train", level)
            counter["i"] += 1
            question = task.prompt[-1].content
            if name in TURN_BUGS:
                buggy = rng.random() < cfg.buggy_fraction
                out.append(transcript(domain, task, TURN_BUGS[name] if buggy else None))
                continue
            bug = BUGS.get(name)
            answer = bug(question) if bug and rng.random() < cfg.buggy_fraction else domain.gold(task)
            out.append([("user", question), ("assistant", answer)])
        return out

    return batch


def transcript(domain, task, bug: TurnBug | None = None) -> Conversation:
    """One episode of a multi-turn domain played through its real environment: the
    gold trajectory (`domain.gold_turns`), or the buggy policy `bug(question, last
    observation)`; the first observation, when there is one, follows the prompt as a
    tool message (as the episode driver puts it)."""
    from posttrain.envs.base import as_step_result

    env = domain.environment()()
    question = task.prompt[-1].content
    gold = domain.gold_turns(task)
    obs = env.reset(task)
    messages: Conversation = [(m.role, m.content) for m in task.prompt] + ([("tool", obs)] if obs else [])
    for turn in range(domain.budget.turns):
        action = bug(question, obs) if bug else gold[min(turn, len(gold) - 1)]
        messages.append(("assistant", action))
        result = as_step_result(env.step(action))
        if result.done:
            break
        obs = result.observation
        messages.append(("tool", obs))
    env.close()
    return messages if messages[-1][0] == "assistant" else messages[:-1]


def _encode(tok, messages: Conversation) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of one conversation rendered by the chat template: each
    assistant turn is what the template puts before it (mask 0) and its content plus
    end-of-turn (mask 1). One user question and one answer render as they always have."""
    ids: list[int] = []
    mask: list[int] = []
    for i, (role, content) in enumerate(messages):
        if role != "assistant":
            continue
        head = [{"role": r, "content": c} for r, c in messages[:i]]
        prompt = tok.encode(
            tok.apply_chat_template(head, add_generation_prompt=True, tokenize=False), add_special_tokens=False
        )
        if prompt[: len(ids)] != ids:
            raise ValueError("the chat template is not prefix-stable; multi-turn pretraining needs it to be")
        answer = tok.encode(content, add_special_tokens=False) + [tok.eos_token_id]
        mask += [0] * (len(prompt) - len(ids)) + [1] * len(answer)
        ids = prompt + answer
    return ids, mask


def _encode_batch(tok, conversations: list[Conversation] | list[tuple[str, str]]):
    """Padded ids, attention and loss masks of conversations (a (question, answer) pair is one
    user turn and one assistant turn)."""

    convs = [[("user", c[0]), ("assistant", c[1])] if isinstance(c, tuple) else c for c in conversations]
    rows, masks = zip(*(_encode(tok, c) for c in convs))
    return padded(tok, rows, masks)


def padded(tok, rows: Sequence[Sequence[int]], masks: Sequence[Sequence[int]]):
    """Rows of token ids right-padded into one batch: ids, attention mask, loss mask (each row's
    `masks` entry, 1 on the tokens the loss counts); the text base's and the vision model's."""
    import torch

    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width))
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.float)
    return ids, attn, loss_mask


def build_base(cfg: BaseConfig, out_dir: Path | None = None, progress: bool = True) -> Path:
    """Pretrain and save the base model; returns its directory. Its build time is stored beside
    it (`posttrain_base.json`) and, for a build into the cache folder, logged there (`BUILDS`).
    A config with `rope_scaling` is not pretrained: `scaled_base`."""
    import torch

    from posttrain.model.arch import random_model, rope_settings

    if cfg.rope_scaling is not None:
        return scaled_base(cfg, out_dir, progress)
    began = time.perf_counter()
    out = Path(out_dir) if out_dir else default_dir(cfg)
    torch.set_num_threads(cfg.threads)
    positions, rope = rope_settings(cfg)
    model, tok = random_model(cfg.preset, seed=cfg.seed, max_positions=positions, rope=rope)
    model.train()
    batches = _examples(cfg, random.Random(cfg.seed))
    start = time.perf_counter()

    def next_batch() -> tuple[dict[str, Any], Any]:
        ids, attn, mask = _encode_batch(tok, batches(cfg.batch_size))
        return {"input_ids": ids, "attention_mask": attn}, mask

    fit_masked_lm(model, next_batch, cfg.steps, cfg.lr, "pretrain base", progress)
    _save(model.eval(), tok, out, cfg, time.perf_counter() - start, time.perf_counter() - began)
    return out


def scaled_base(cfg: BaseConfig, out_dir: Path | None = None, progress: bool = True) -> Path:
    """The base of a config with `rope_scaling`: the weights of `cfg.unscaled()` (its cached
    base, built first when missing: `ensure_base`) saved with the scaled RoPE in their
    config.json (`rope_settings`). RoPE has no parameters, so no weight changes; positions
    past the learned ones are read as the scaling says. Returns its directory."""
    from transformers import AutoModelForCausalLM

    from posttrain.model.arch import load_tokenizer, rope_settings

    began = time.perf_counter()
    source = ensure_base(cfg.unscaled(), progress=progress)
    model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True)
    positions, rope = rope_settings(cfg)
    model.config.max_position_embeddings = positions
    model.config.rope_parameters = rope
    out = Path(out_dir) if out_dir else default_dir(cfg)
    _save(model.eval(), load_tokenizer(source), out, cfg, 0.0, time.perf_counter() - began, weights_of=source.name)
    return out


def pretrain_optimizer(params: list[Any], lr: float, steps: int) -> tuple[Any, Any]:
    """The embedded builds' optimizer and schedule for `steps`: AdamW (betas 0.9/0.95, weight decay
    0.01) at `lr`, a linear warm-up over the first steps/20, then cosine decay."""
    import math

    import torch

    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))
    )
    return opt, sched


def fit_masked_lm(
    model: Any, next_batch: Callable[[], tuple[dict[str, Any], Any]], steps: int, lr: float, label: str, progress: bool
) -> float:
    """Pretrain `model` in place, the one loop of the embedded bases (text and vision): AdamW
    (betas 0.9/0.95, weight decay 0.01), a linear warm-up over the first steps/20 then cosine
    decay, gradients clipped at 1.0; the loss is the next-token cross-entropy on the positions
    `mask` marks. `next_batch()` gives the model's inputs (input_ids first among them) and that
    mask; a progress bar named `label` shows the loss every 20 steps. Returns the last step's loss."""
    import torch

    from posttrain.progress import progress as progress_bar

    opt, sched = pretrain_optimizer(list(model.parameters()), lr, steps)
    bar = progress_bar(steps, label, disable=not progress)
    last = float("nan")
    for step in range(steps):
        inputs, mask = next_batch()
        ids = inputs["input_ids"]
        logits = model(**inputs).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
        bar.update(1)
        last = float(loss.item()) if step == steps - 1 else last
    bar.close()
    return last


def _save(
    model, tok, out: Path, cfg: BaseConfig, seconds: float, build_seconds: float, weights_of: str | None = None
) -> None:
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    from posttrain.model.tokenizer import save_tokenizer

    save_tokenizer(tok, tmp)
    info = {
        "base_config": cfg.model_dump(),
        "data_digest": data_digest(cfg),
        "pretrain_seconds": round(seconds, 3),
        "build_seconds": round(build_seconds, 3),
        "buggy_solvers": sorted(BUGS),
    }
    if weights_of:
        info["weights_of"] = weights_of
    if set(cfg.domains) & set(TURN_BUGS):
        info["buggy_policies"] = sorted(set(cfg.domains) & set(TURN_BUGS))
    (tmp / "posttrain_base.json").write_text(json.dumps(info, indent=2))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    if out.resolve() == default_dir(cfg).resolve() and not weights_of:  # the log times pretraining builds
        row = {  # domains and batch size: what `last_build` estimates another base from
            "base": out.name,
            "preset": cfg.preset,
            "steps": cfg.steps,
            "seconds": round(build_seconds, 3),
            "domains": cfg.domains,
            "batch_size": cfg.batch_size,
            "time": round(time.time()),
        }
        with open(DEFAULT_CACHE / BUILDS, "a") as f:
            f.write(json.dumps(row) + "\n")


def ensure_base(cfg: BaseConfig, progress: bool = True, log: Callable[[str], None] | None = None) -> Path:
    """The cached base model for `cfg`: built if missing (saying so first, with how long its last
    build here took: `build_note`; on stderr unless `log`), rebuilt (saying why) when the cache
    was built from other data than this code gives (`data_digest`; a cache from before the
    digest was recorded counts as other data). Processes that ask for one base at once (test
    workers, two runs on one machine) take turns on a lock file beside it: one builds, the
    others then find it cached."""
    import fcntl

    out = default_dir(cfg)
    current = data_digest(cfg)
    if _stored_digest(out) == current:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    say = log or (lambda m: print(m, file=sys.stderr, flush=True))
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stored = _stored_digest(out)
        if stored == current:
            return out
        if (out / "config.json").is_file():
            say(
                f"posttrain: the cached base {out} was built from other pretraining data than this code gives "
                f"(digest {stored or 'not recorded'}, now {current}): rebuilding it; {build_note(cfg)}"
            )
        else:
            say(f"posttrain: building the base model {out} (not cached; `posttrain base list`): {build_note(cfg)}")
        return build_base(cfg, out, progress=progress)


def is_cached(cfg: BaseConfig) -> bool:
    """Whether `ensure_base(cfg)` would reuse the cache (no build)."""
    return _stored_digest(default_dir(cfg)) == data_digest(cfg)


def _stored_digest(out: Path) -> str | None:
    """The data digest a cached base at `out` was built with; None without one (no weights,
    a cache from before the digest was recorded, or an unreadable record)."""
    if not (out / "config.json").is_file():
        return None
    try:
        return json.loads((out / "posttrain_base.json").read_text()).get("data_digest")
    except (OSError, ValueError, AttributeError):
        return None
