"""Write a JSONL of chat demonstrations for `posttrain sft` from a registered domain's own tasks
and gold answers: each line is {"messages": [the task's prompt..., {"role": "assistant",
"content": the domain's gold completion}]}, drawn from the domain's train split (never its
held-out split), so a fine-tuned model is evaluated on tasks it has not seen. An assistant turn
inside a task's prompt (pyfunc_fix's planted failing attempt) is written with `"weight": 0`:
the gold revision is learned in its context, the attempt is not.

    .venv/bin/python scripts/sft_demos.py rg_spell_backward --difficulty 1 --n 2000 --out demos.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys


def demos(domain: str, difficulty: int, n: int, start: int = 0) -> list[dict]:
    """`n` demonstrations of `domain` at `difficulty`: train-split tasks `start`..`start+n-1`."""
    from posttrain.domains.registry import get

    dom = get(domain)
    rows = []
    for index in range(start, start + n):
        task = dom.sample(index, "train", difficulty)
        messages = [prompt_message(m) for m in task.prompt]
        rows.append({"messages": [*messages, {"role": "assistant", "content": dom.gold(task)}]})
    return rows


def prompt_message(m) -> dict:
    """A prompt message as a demonstration's: an assistant turn in the task's prompt (pyfunc_fix's
    planted failing attempt) is context with `"weight": 0`, never learned."""
    out = {"role": m.role, "content": m.content}
    return {**out, "weight": 0} if m.role == "assistant" else out


def write(rows: list[dict], path: str) -> None:
    with open(path, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("domain", help="a registered domain (posttrain domains)")
    p.add_argument("--difficulty", type=int, default=1)
    p.add_argument("--n", type=int, default=1000, help="demonstrations to write")
    p.add_argument("--start", type=int, default=0, help="first train-split task index")
    p.add_argument("--out", required=True, help="the JSONL file to write")
    args = p.parse_args(argv)
    write(demos(args.domain, args.difficulty, args.n, args.start), args.out)
    print(f"{args.out}: {args.n} demonstrations of {args.domain} (difficulty {args.difficulty}, train split)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
