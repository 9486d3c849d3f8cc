"""`posttrain config show [CONFIG] [overrides ...]`: the resolved config of a command line;
`posttrain config fields SECTION`: a section's fields with type, default, bounds and docstring
(docs/config.md maps TRL's and verl's names to posttrain's)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="show the resolved config of a command line, or a section's fields")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    s = verbs.add_parser("show", help="the config train/eval/sft would run with (YAML), defaults filled in")
    s.add_argument("config", nargs="?", help="YAML config (sparse)")
    s.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-4")
    s.add_argument("--section", help="only this section (dotted, e.g. trainer.loss)")
    f = verbs.add_parser("fields", help="a section's fields: type, default, bounds, docstring")
    f.add_argument("section", nargs="?", default="", help="dotted section, e.g. trainer or trainer.loss (default: top)")
    p.set_defaults(func=run, verb=None)


def run(args: argparse.Namespace) -> int:
    from posttrain.errors import ConfigError

    if args.verb == "show":
        return _show(args)
    if args.verb == "fields":
        return _fields(args.section)
    raise ConfigError("config: give a verb: show [CONFIG] [overrides ...] or fields SECTION")


def _show(args: argparse.Namespace) -> int:
    import yaml

    from posttrain.configs import load_config, split_cli_args
    from posttrain.errors import ConfigError

    config, overrides = split_cli_args(args.config, args.overrides)
    data = load_config(config, overrides).model_dump(mode="json")
    for part in [p for p in (args.section or "").split(".") if p]:
        if not isinstance(data, dict) or part not in data:
            raise ConfigError(f"--section {args.section}: no {part!r} here")
        data = data[part]
    print(yaml.safe_dump(data, sort_keys=False).rstrip())
    return 0


def _fields(section: str) -> int:
    from posttrain.configs import Config
    from posttrain.configs.schema import fields, section_models

    for label, model in section_models(Config, section):
        title = ".".join(p for p in (section, label) if p) or "(top level)"
        print(f"{title}  [{model.__name__}]")
        for f in fields(model):
            bounds = f"  ({f.bounds})" if f.bounds else ""
            print(f"  {f.name}: {f.type} = {f.default}{bounds}")
            if f.doc:
                print(f"      {f.doc}")
    return 0
