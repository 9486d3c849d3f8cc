"""`posttrain domains`: list every registered domain; `show NAME`: one domain
with a sample task, its gold answer and scores; `hygiene`: dedupe and
train/eval n-gram contamination report."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("domains", help="list task domains (category, verifier, cost, levels, sample prompt)")
    p.add_argument("--category", help="only domains of this category (e.g. math, sql, agents, rg_games)")
    p.add_argument("--no-sample", action="store_true", help="skip the sample prompt column (fast)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--config", help="a run config: its source domains (tasks.domains.NAME.source) join the list, show and hygiene"
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    s = verbs.add_parser("show", help="one domain: a sample task, its gold answer and the scores")
    s.add_argument("name")
    s.add_argument("--level", type=int, default=1, help="difficulty level (default 1)")
    s.add_argument("--split", choices=("train", "eval"), default="train")
    s.add_argument("--index", type=int, default=0, help="task index (default 0)")
    h = verbs.add_parser("hygiene", help="dedupe and n-gram contamination of train against eval")
    h.add_argument("names", nargs="*", help="domains (default: the built-in five)")
    h.add_argument("--tasks", type=int, default=200, help="train tasks per domain and level 1 (eval: a quarter)")
    h.add_argument("--ngram", type=int, default=8)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.config:
        from posttrain.byo.build import register_sources
        from posttrain.configs import load_config

        register_sources(load_config(args.config).tasks)
    if args.verb == "show":
        return show(args)
    if args.verb == "hygiene":
        return hygiene(args)
    return list_domains(args)


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def list_domains(args: argparse.Namespace) -> int:
    from posttrain.domains.registry import all_domains, origin

    rows = []
    for name, d in all_domains().items():
        if args.category and d.category != args.category:
            continue
        sample = "" if args.no_sample else d.sample(0, "train", 1).prompt[-1].content
        rows.append(
            {
                "name": name,
                "category": d.category,
                "verifier": d.verifier.name,
                "cost": d.cost_class,
                "levels": d.levels,
                "origin": origin(name),
                "sample": sample,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'NAME':<34} {'CATEGORY':<16} {'VERIFIER':<18} {'COST':<5} {'LV':>2}  {'ORIGIN':<28} SAMPLE")
    for r in rows:
        print(
            f"{r['name']:<34} {r['category']:<16} {r['verifier']:<18} {r['cost']:<5} {r['levels']:>2}  "
            f"{_one_line(_short(r['origin']), 28):<28} {_one_line(r['sample'], 60)}"
        )
    print(f"{len(rows)} domains")
    return 0


def _short(origin: str) -> str:
    """builtin (posttrain.domains.add) -> builtin; plugin NAME VERSION (module:attr) -> plugin NAME VERSION."""
    return origin.split(" (")[0] if origin.startswith(("builtin", "plugin")) else origin


def show(args: argparse.Namespace) -> int:
    from posttrain.domains.registry import get
    from posttrain.errors import TaskError
    from posttrain.types import Episode

    d = get(args.name)
    if not 1 <= args.level <= d.levels:
        raise TaskError(f"--level must be in 1..{d.levels} for {d.name}, got {args.level}")
    task = d.sample(args.index, args.split, args.level)
    gold, wrong = d.gold(task), d.wrong(task)
    gs, ws = d.score(task, Episode(gold)), d.score(task, Episode(wrong))
    from posttrain.domains.registry import origin

    print(f"{d.name}: {d.description}")
    print(f"origin {origin(d.name)}")
    print(
        f"category {d.category} | verifier {d.verifier.name} v{d.verifier.version} | cost {d.cost_class} | "
        f"levels {d.levels} | budget {d.budget} | multi-turn {'yes' if d.environment() is not None else 'no'}"
    )
    print(f"task {task.id} | taskset {task.meta.taskset_version}\n")
    for m in task.prompt:
        print(f"[{m.role}]\n{m.as_text()}\n")  # an image by its size and digest
    print(f"[gold answer]\n{gold}\n-> score {gs.value:.3f} {dict(gs.parts)}\n")
    print(f"[a wrong answer]\n{wrong}\n-> score {ws.value:.3f} {dict(ws.parts)} {ws.reason}")
    return 0


def hygiene(args: argparse.Namespace) -> int:
    from posttrain.domains.hygiene import contamination, dedupe
    from posttrain.domains.registry import get

    names = args.names or ["add", "sub", "mul", "reverse", "sort"]
    print(
        f"{'DOMAIN':<30} {'TRAIN':>6} {'EXACT_DUP':>9} {'NORM_DUP':>8} {'EVAL':>5} {'IN_TRAIN':>8} {'CONTAM':>6} "
        f"{'MAX_OV':>6}"
    )
    for name in names:
        d = get(name)
        size = getattr(d, "size", None)  # a file domain: at most its distinct rows
        n_train = min(args.tasks, size("train", 1)) if size else args.tasks
        n_eval = min(max(args.tasks // 4, 1), size("eval", 1)) if size else max(args.tasks // 4, 1)
        train = [d.sample(i, "train", 1) for i in range(n_train)]
        eval_ = [d.sample(i, "eval", 1) for i in range(n_eval)]
        dd = dedupe(train)
        rep = contamination(name, train, eval_, n=args.ngram)
        print(
            f"{name:<30} {dd.total:>6} {dd.exact_duplicates:>9} {dd.normalised_duplicates:>8} {rep.eval_tasks:>5} "
            f"{rep.exact_overlap:>8} {rep.contaminated:>6} {rep.max_overlap:>6.2f}"
        )
    return 0
