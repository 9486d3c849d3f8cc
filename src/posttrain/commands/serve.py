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


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import uvicorn

    from posttrain.serve.server import build_server

    cfg = build_config(args)
    app = build_server(cfg)
    app.state.server.preload()  # a model that does not load: one error line, exit 2
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="info")
    return 0
