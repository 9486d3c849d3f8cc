"""`posttrain tasks validate PATH` and `posttrain tasks stats PATH`: check a task file (or every
source domain of a config) before training. PATH is a run config (YAML) or a data file or
`datasets` directory with the mapping and verifier given as options."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tasks", help="check your own task files: schema, duplicates, overlap, gold answers, lengths")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, text in (
        (
            "validate",
            "schema check (line of each bad row), duplicates, train/held-out overlap, "
            "gold answers scored by the verifier; exit 1 on any problem",
        ),
        ("stats", "validate's counts plus the prompt-length distribution in tokens (chat template included)"),
    ):
        v = verbs.add_parser(verb, help=text)
        v.add_argument(
            "path",
            help="a run config (.yaml) with tasks.domains.NAME.source, or a JSONL/CSV/Parquet file "
            "or datasets directory",
        )
        v.add_argument("--domain", help="with a config: only this domain")
        v.add_argument(
            "--format", default="auto", help="with a data file: jsonl, csv, parquet, datasets (default: by suffix)"
        )
        v.add_argument(
            "--field",
            action="append",
            default=[],
            metavar="ROLE=COLUMN",
            help="with a data file: field mapping, e.g. --field prompt=question --field answer=gold",
        )
        v.add_argument(
            "--verifier", default="exact", help="with a data file: verifier name or module:function (default exact)"
        )
        v.add_argument(
            "--set", action="append", default=[], metavar="KEY=VALUE", help="with a data file: a verifier parameter"
        )
        v.add_argument("--gold", type=int, default=200, help="gold answers scored per split (default 200)")
        v.add_argument("--show", type=int, default=20, help="problems listed (default 20)")
        if verb == "stats":
            v.add_argument("--model", help="tokenizer of this model directory (default: the embedded model's)")
        v.set_defaults(func=run)


def _specs(args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """(name -> DomainSpec, model path) from a config file, or from a data file and the options."""
    from posttrain.configs import parse_yaml
    from posttrain.configs.tasks import DomainSpec
    from posttrain.errors import ConfigError

    if args.path.endswith((".yaml", ".yml")):
        from posttrain.configs import load_config

        cfg = load_config(args.path)
        specs = {n: s for n, s in cfg.tasks.domains.items() if s.source is not None}
        if args.domain:
            if args.domain not in specs:
                raise ConfigError(
                    f"{args.path}: no source domain {args.domain!r}; it has: {', '.join(specs) or 'none'}"
                )
            specs = {args.domain: specs[args.domain]}
        if not specs:
            raise ConfigError(f"{args.path}: tasks.domains has no domain with a source")
        return specs, cfg.model.path
    fields = {}
    for item in args.field:
        role, sep, column = item.partition("=")
        if not sep:
            raise ConfigError(f"--field {item!r}: expected ROLE=COLUMN")
        fields[role] = column
    params = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        params[key] = parse_yaml(value, f"--set {key}")  # bounded, one-line errors
    verifier = {"name": "python", "path": args.verifier} if ":" in args.verifier else {"name": args.verifier}
    try:
        spec = DomainSpec.model_validate(
            {"source": {"path": args.path, "format": args.format, "fields": fields}, "verifier": {**verifier, **params}}
        )
    except ValueError as exc:
        raise ConfigError(f"{args.path}: {exc}") from None
    return {"file": spec}, None


def _tokenizer(args: argparse.Namespace, model_path: str | None) -> Any:
    if args.verb != "stats":
        return None
    path = args.model or model_path
    if path:
        from posttrain.model.arch import load_tokenizer

        return load_tokenizer(path)
    from posttrain.model.tokenizer import build_tokenizer

    return build_tokenizer()


def run(args: argparse.Namespace) -> int:
    from posttrain.byo.build import source_domain
    from posttrain.byo.checks import inspect, length_summary

    specs, model_path = _specs(args)
    tokenizer = _tokenizer(args, model_path)
    failed = False
    for name, spec in specs.items():
        domain = source_domain(name, spec, check=False)
        rep = inspect(domain, args.gold, tokenizer)
        print(
            f"{name}: {rep.path} | verifier {domain.spec.name} | {rep.rows} rows: {rep.train} train, {rep.eval} "
            "held-out, "
            f"{len(rep.bad)} bad, {rep.skipped} skipped (split value neither train nor held-out) | levels {rep.levels}"
        )
        print(f"  duplicates: {rep.duplicates} exact, {rep.near_duplicates} near (same words, other punctuation/case)")
        print(
            f"  train/held-out overlap: {rep.overlap_rows} rows dropped (prompt in both splits), "
            f"{rep.overlap_near} near-duplicate prompts across splits"
        )
        print(
            f"  gold answers: {rep.gold_passed}/{rep.gold_scored} pass their verifier"
            f"{f', {rep.gold_infra} infra errors' if rep.gold_infra else ''}"
            f"{f', {rep.no_gold} rows without a gold completion (not scored)' if rep.no_gold else ''}"
        )
        if tokenizer is not None:
            print(f"  prompt tokens: {length_summary(rep.lengths)}")
        problems = rep.problems()
        for line in problems[: args.show]:
            print(f"  problem: {line}")
        if len(problems) > args.show:
            print(f"  ... {len(problems) - args.show} more problems")
        print(f"  {'ok' if rep.ok else 'PROBLEMS FOUND'}")
        failed |= not rep.ok
    return 1 if failed else 0
