"""`posttrain base list|build [CONFIG ...] [overrides]`: which embedded base each config uses, and building them.

`list` names, per config, the base it pretrains (preset, cache folder), whether it is cached
and how long its last build here took; `build` builds the bases of the configs given (`--all`:
every configs/*.yaml), each once, saying before each how long it took last time. A config with
model.path uses no embedded base. `vlm` builds the embedded vision-language model
(model/vision.py) of a seed, step counts and image size, into the cache unless `--out`, and
prints its folder, weights digest, build time and peak RSS (and, with a reading stage, the share
of printed characters it reads on held-out images).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posttrain.configs.base import BaseConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("base", help="the embedded base models: which each config uses, cached or not; build them")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    lst = verbs.add_parser("list", help="each config's base: preset, cache folder, cached or not, last build time")
    lst.add_argument("args", nargs="*", metavar="CONFIG|OVERRIDE", help="YAML configs (default: configs/*.yaml)")
    lst.set_defaults(func=run_list)
    b = verbs.add_parser("build", help="pretrain the bases of the configs given (deterministic from their seeds)")
    b.add_argument(
        "args", nargs="*", metavar="CONFIG|OVERRIDE", help="YAML configs and dotted overrides, e.g. base.steps=500"
    )
    b.add_argument("--all", action="store_true", help="the bases of every configs/*.yaml")
    b.add_argument("--out", metavar="DIR", help="where to save it, for one base (default: the cache directory)")
    b.add_argument("--force", action="store_true", help="rebuild even if the cached model exists")
    b.set_defaults(func=run_build)
    v = verbs.add_parser("vlm", help="build the embedded vision-language model (deterministic from its seed)")
    v.add_argument("--seed", type=int, default=0, help="the build's seed (default 0)")
    v.add_argument("--steps", type=int, default=None, help="pretraining steps (default: model/vision.py's)")
    v.add_argument("--pool", type=int, default=None, help="train tasks drawn per family (default: model/vision.py's)")
    v.add_argument(
        "--image-size", type=int, default=None, help="pixels a side the model sees (default: model/vision.py's)"
    )
    v.add_argument("--patch-size", type=int, default=None, help="pixels a side of an image token's patch")
    v.add_argument(
        "--ocr-steps", type=int, default=None, help="steps of the reading stage before the questions (0: none)"
    )
    v.add_argument(
        "--fresh", action="store_const", const=True, default=None, help="an unseen train task every row, not the pool"
    )
    v.add_argument("--out", metavar="DIR", help="where to save it (default: the cache directory)")
    v.add_argument("--force", action="store_true", help="rebuild even if the cached model exists")
    v.set_defaults(func=run_vlm)


def _configs(args: list[str], every: bool) -> tuple[list[str | None], list[str]]:
    """The configs (None: the defaults) and overrides of a command line; `every` (or no config
    given to `list`) means configs/*.yaml in the current folder."""
    from posttrain.errors import ConfigError

    overrides = [a for a in args if "=" in a]
    configs: list[str | None] = [a for a in args if "=" not in a]
    if every:
        found = sorted(str(p) for p in Path("configs").glob("*.yaml"))
        if not found:
            raise ConfigError("--all: no configs/*.yaml in the current folder")
        configs += [c for c in found if c not in configs]
    return configs or [None], overrides


def _bases(configs: list[str | None], overrides: list[str]) -> dict[str, tuple[BaseConfig | None, list[str]]]:
    """Cache folder name -> (the BaseConfig, the configs that use it); a config with model.path is
    under the key 'model.path VALUE' with None."""
    from posttrain.configs import load_config
    from posttrain.model.pretrain import default_dir

    out: dict[str, tuple[BaseConfig | None, list[str]]] = {}
    for name in configs:
        cfg = load_config(name, overrides)
        key = f"model.path {cfg.model.path}" if cfg.model.path else default_dir(cfg.base).name
        out.setdefault(key, (None if cfg.model.path else cfg.base, []))[1].append(name or "(defaults)")
    return out


def _state(base: BaseConfig) -> str:
    from posttrain.model.pretrain import default_dir, is_cached

    if not (default_dir(base) / "config.json").is_file():
        return "not built"
    return "cached" if is_cached(base) else "stale (other data than this code gives)"


def run_list(args: argparse.Namespace) -> int:
    from posttrain.model.pretrain import build_note

    configs, overrides = _configs(args.args, every=not [a for a in args.args if "=" not in a])
    missing = 0
    for key, (base, names) in _bases(configs, overrides).items():
        for name in names:
            if base is None:
                print(f"{name}: {key}: no embedded base")
                continue
            state = _state(base)
            missing += state != "cached"
            print(f"{name}: {key} (preset {base.preset}, {base.steps} steps): {state}; {build_note(base)}")
    if missing:
        print(f"{missing} without their base: `posttrain base build CONFIG` (or --all) builds it, else their `train`")
    from posttrain.model import pretrain

    print(f"cache folder: {pretrain.DEFAULT_CACHE}")
    return 0


def run_build(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from posttrain.errors import ConfigError
    from posttrain.model.pretrain import build_base, build_note, default_dir, ensure_base, is_cached

    configs, overrides = _configs(args.args, args.all)
    if configs == [None]:
        print("no config given: the base of the built-in defaults (`posttrain base list` names each config's base)")
    bases = _bases(configs, overrides)
    wanted = {k: v for k, v in bases.items() if v[0] is not None}
    for key, (_, names) in bases.items():
        if key not in wanted:
            print(f"{', '.join(names)}: {key}: no embedded base to build")
    if args.out and len(wanted) != 1:
        raise ConfigError(f"--out names one folder: give configs of one base (these use {len(wanted)})")
    for base, names in wanted.values():
        users = ", ".join(names)
        if args.out or args.force:
            out = Path(args.out) if args.out else default_dir(base)
            print(f"building base {out} for {users}: {build_note(base)}", flush=True)
            print(f"base model built: {build_base(base, out)}")
        elif is_cached(base):
            print(f"base model already built: {default_dir(base)} ({users})")
        else:
            print(f"base model built: {ensure_base(base, log=lambda m, u=users: print(f'{m} (for {u})', flush=True))}")
    return 0


def run_vlm(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from posttrain.errors import ConfigError
    from posttrain.model.vision import INFO, VisionSpec, build_vlm, default_dir, ensure_vlm

    try:
        fields = ("steps", "pool", "image_size", "patch_size", "ocr_steps", "fresh")
        given = {k: getattr(args, k) for k in fields if getattr(args, k) is not None}
        spec = dataclasses.replace(VisionSpec(seed=args.seed), **given)
    except ValueError as exc:
        raise ConfigError(f"posttrain base vlm: {exc}") from exc
    if args.out or args.force:
        out = build_vlm(spec, Path(args.out) if args.out else default_dir(spec))
    else:
        out = ensure_vlm(spec)
    info = json.loads((out / INFO).read_text())
    print(
        f"vision model: {out} (seed {spec.seed}, {spec.steps} steps): weights {info['weights_digest']}, "
        f"built in {info['build_seconds']:.0f}s, peak RSS {info['peak_rss_mib']:.0f} MiB"
    )
    if "read_heldout" in info:
        reads = ", ".join(f"{k} {v:.2f}" for k, v in sorted(info["read_heldout"].items()))
        print(f"characters read on held-out images ({spec.ocr_steps} reading steps): {reads}")
    return 0
