"""`posttrain sandbox probe`: what this machine offers the sandbox, which
backend a config would get, and what each backend enforces.
`posttrain sandbox run -- CMD ...`: run one command in the sandbox (a smoke test)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sandbox",
        help="probe the sandbox backends, or run one command in the sandbox",
        description="posttrain sandbox probe [--backend B] [--accept-weaker B] | posttrain sandbox run -- CMD ...",
    )
    p.add_argument("action", choices=["probe", "run"], help="probe: report; run: execute CMD in a fresh sandbox")
    p.add_argument("--backend", default="auto", help="auto | forkserver | bwrap | unsafe")
    p.add_argument(
        "--accept-weaker",
        action="append",
        default=[],
        metavar="BACKEND",
        help="a weaker backend `auto` may fall back to (repeatable)",
    )
    p.add_argument("--wall", type=float, default=10.0, help="with run: wall-clock limit in seconds")
    p.add_argument("cmd", nargs="*", help="with run: the command and its arguments, after --")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from pydantic import ValidationError

    from posttrain.configs.sandbox import SandboxConfig
    from posttrain.errors import ConfigError
    from posttrain.sandbox import ExecRequest, Limits, Pool, probe, select_backend

    try:
        config = SandboxConfig(backend=args.backend, accept_weaker=tuple(args.accept_weaker))
    except ValidationError as exc:
        raise ConfigError(f"sandbox: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}") from None
    found = probe(config.python)
    if args.action == "probe":
        print(found.report())
        try:
            print(f"selected backend: {select_backend(config, found)}")
        except ConfigError as exc:
            print(f"selected backend: none ({exc})")
            return 1
        return 0
    cmd = [c for c in args.cmd if c != "--"] if args.cmd[:1] == ["--"] else list(args.cmd)
    if not cmd:
        raise ConfigError("sandbox run: give a command after --")
    with Pool(config.model_copy(update={"workers": 1}), found=found) as pool:
        res = pool.run(ExecRequest(argv=tuple(cmd), limits=Limits(wall_s=args.wall)))
    sys.stdout.write(res.stdout.decode("utf-8", "replace"))
    sys.stderr.write(res.stderr.decode("utf-8", "replace"))
    print(
        f"[{res.backend}] status={res.status} exit={res.exit_code} signal={res.signal} cpu={res.cpu_s:.3f}s "
        f"wall={res.wall_s:.3f}s" + (f" error={res.error}" if res.error else ""),
        file=sys.stderr,
    )
    return 0 if res.status == "ok" else 1
