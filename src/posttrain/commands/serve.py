"""`posttrain serve`: the OpenAI-compatible server over a registry or one model directory."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (standard and fast tiers)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--registry", help="model registry directory (from `posttrain release`)")
    src.add_argument(
        "--model", help="one Hugging Face model directory or a real model's name (posttrain models list), served as v0"
    )
    src.add_argument(
        "--policy",
        help="a rule-based chat model, package.module:function (messages -> reply text), for testing judges",
    )
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (default 8000)")
    p.add_argument("--config", help="YAML file with serve settings (see docs/serving.md)")
    p.add_argument(
        "--admin-token-file",
        help="file holding the bearer token that /v1/update_weights and /admin/* require "
        "(default: the POSTTRAIN_ADMIN_TOKEN environment variable)",
    )
    p.add_argument(
        "--insecure-admin",
        action="store_true",
        help="admin endpoints need no token (they still accept loopback clients only, see admin.allow_clients)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted override, e.g. --set fast.mode=int8 --set canary.share=0.2",
    )
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> Any:
    """The serve config from `--config`, `--set` and the flags. The file is read by the
    project's bounded loader (bad UTF-8, nesting past 64, alias bombs and duplicate keys are
    one-line ConfigErrors), and `--set` values are parsed under the same bounds."""
    from posttrain.configs import apply_override, read_yaml
    from posttrain.configs.serve import load_serve_config
    from posttrain.errors import ConfigError

    data: dict[str, Any] = read_yaml(args.config) if args.config else {}
    for item in args.set:
        key, sep, _ = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        apply_override(data, item)
    for name in ("registry", "model", "policy", "host", "port"):
        if getattr(args, name) is not None:
            data[name] = getattr(args, name)
    token_file, insecure = getattr(args, "admin_token_file", None), getattr(args, "insecure_admin", False)
    if token_file or insecure:
        admin = data.setdefault("admin", {})
        if not isinstance(admin, dict):
            raise ConfigError("serve config: admin must be a mapping")
        if token_file:
            admin["token_file"] = token_file
        if insecure:
            admin["auth"] = False
    return load_serve_config(data)


ACCEPT_BACKLOG = 32
"""The listen backlog, which asyncio also uses as the most connections it accepts per wake-up."""


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import uvicorn

    from posttrain.serve.server import build_server

    cfg = build_config(args)
    app = build_server(cfg)
    app.state.server.preload()  # a model that does not load: one error line, exit 2
    from posttrain.serve.connections import guarded_protocol

    # connections bounded per client and in all, headers within serve.limits.header_timeout_s
    metrics = getattr(app.state.server, "metrics", None)  # a policy server has none
    http = guarded_protocol(cfg.limits, metrics.connections_closed if metrics is not None else None)
    # backlog: also how many connections asyncio accepts in one go before the guard sees them;
    # small, so that a burst cannot overshoot the descriptor reserve before evictions run
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="info", http=http, backlog=ACCEPT_BACKLOG)
    return 0
