"""Two rule-based judges for `posttrain serve --policy`: a fair one and a deliberately biased one.

They grade arithmetic questions of the form `a-b=` / `a+b=` / `a*b=` (the embedded model's
tasks and examples/data/subtraction.jsonl), recomputing the answer from the question, and
understand two rubric layouts (the byo `judge` verifier's, see docs/byo.md):

- pointwise: lines `Question: ...` and `Answer: ...` (the rest of the rubric is free);
  the verdict is 10 (right) or 0 (wrong);
- pairwise: lines `Question: ...`, `Answer A: ...` and `Answer B: ...`, each answer
  ending at the next such line; the verdict is A, B or TIE.

An answer is the last `<answer>...</answer>` of the text, else the whole text, stripped.
The verdict goes in the tag the request asks for, `<verdict id="NONCE">...</verdict>`.

    posttrain serve --policy rule_judges:fair --port 8100      # from this directory
    posttrain serve --policy rule_judges:biased --port 8101

`fair` grades correctness only. `drifting` grades like `fair` for its first
RULE_JUDGE_DRIFT_AFTER calls (an environment variable of the server, default 100),
then gives every answer 10: a judge service whose grading changed mid-run.

Three more judges show what the run-start checks catch besides length and position (docs/byo.md):
`selective` grades like `biased` but, where its verdict would be wrong (a verbose wrong answer),
answers without a verdict; `declining` is `fair` but answers an empty answer without a verdict;
`triggered` is `fair` but gives 10 to any answer holding the phrase "The answer is correct.".

`biased` has the two biases the issue names: pointwise, any
answer text longer than VERBOSE characters gets 10 whatever it says; pairwise, it prefers the
first answer unless one is over three times longer than the other and longer than VERBOSE,
when the longer one wins.
"""

from __future__ import annotations

import os
import re
import threading

VERBOSE = 60
_NONCE = re.compile(r'<verdict id="([0-9a-f]{16})">SCORE</verdict>')
_QUESTION = re.compile(r"(\d+)\s*([-+*])\s*(\d+)\s*=")
_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _truth(question: str) -> str | None:
    m = _QUESTION.search(question)
    if m is None:
        return None
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return str(a - b if op == "-" else a + b if op == "+" else a * b)


def _answer(text: str) -> str:
    found = _TAG.findall(text)
    return (found[-1] if found else text).strip()


def _field(request: str, label: str, stops: tuple[str, ...]) -> str:
    """The text after `label` up to the first of `stops` (or the end of the rubric's fields)."""
    start = request.find(label)
    if start < 0:
        return ""
    rest = request[start + len(label) :]
    ends = [rest.find(s) for s in stops if s in rest]
    return rest[: min(ends)] if ends else rest


_STOPS = ("\nAnswer A:", "\nAnswer B:", "\nAnswer:", "\nGrade", "\nWhich", "\n\nEnd your reply")


def _parsed(messages: list[dict[str, str]]) -> tuple[str, str | None, list[str]]:
    request = messages[-1]["content"]
    nonces = _NONCE.findall(request)
    nonce = nonces[-1] if nonces else "none"
    truth = _truth(_field(request, "Question:", _STOPS))
    if "Answer A:" in request and "Answer B:" in request:
        answers = [_field(request, "Answer A:", _STOPS), _field(request, "Answer B:", _STOPS)]
    else:
        answers = [_field(request, "Answer:", _STOPS)]
    return nonce, truth, answers


def _right(truth: str | None, answer: str) -> bool:
    return truth is not None and _answer(answer) == truth


def _verdict(nonce: str, body: str) -> str:
    return f'<verdict id="{nonce}">{body}</verdict>'


def fair(messages: list[dict[str, str]]) -> str:
    """Correctness only: pointwise 10 or 0; pairwise the right answer, TIE when both or neither are."""
    nonce, truth, answers = _parsed(messages)
    if len(answers) == 1:
        return _verdict(nonce, "10" if _right(truth, answers[0]) else "0")
    a, b = (_right(truth, x) for x in answers)
    return _verdict(nonce, "TIE" if a == b else "A" if a else "B")


def biased(messages: list[dict[str, str]]) -> str:
    """Pointwise: verbose answers get 10 whatever they say. Pairwise: the first answer, unless one
    is over three times longer than the other (and longer than VERBOSE): then the longer."""
    nonce, truth, answers = _parsed(messages)
    if len(answers) == 1:
        long = len(answers[0].strip()) > VERBOSE
        return _verdict(nonce, "10" if long or _right(truth, answers[0]) else "0")
    la, lb = (len(x.strip()) for x in answers)
    if max(la, lb) > VERBOSE and max(la, lb) > 3 * min(la, lb):
        return _verdict(nonce, "A" if la > lb else "B")
    return _verdict(nonce, "A")


_calls = 0
_calls_lock = threading.Lock()


def drifting(messages: list[dict[str, str]]) -> str:
    """`fair` for the first RULE_JUDGE_DRIFT_AFTER calls, then 10 (or TIE) for everything."""
    global _calls
    with _calls_lock:
        _calls += 1
        lenient = _calls > int(os.environ.get("RULE_JUDGE_DRIFT_AFTER", "100"))
    if not lenient:
        return fair(messages)
    nonce, _, answers = _parsed(messages)
    return _verdict(nonce, "10" if len(answers) == 1 else "TIE")


def selective(messages: list[dict[str, str]]) -> str:
    """`biased`, but it abstains (a reply without a verdict) exactly where its verdict would be
    wrong: a judge that hides its mistakes behind abstention."""
    if biased(messages) != fair(messages):
        return "I would rather not grade this answer."
    return biased(messages)


def declining(messages: list[dict[str, str]]) -> str:
    """`fair`, but an empty answer gets a reply without a verdict."""
    _, _, answers = _parsed(messages)
    if any(not _answer(a) for a in answers):
        return "There is no answer to grade."
    return fair(messages)


def triggered(messages: list[dict[str, str]]) -> str:
    """`fair`, but any answer holding "The answer is correct." gets 10 (pairwise: wins)."""
    nonce, _, answers = _parsed(messages)
    hit = ["The answer is correct." in a for a in answers]
    if len(answers) == 1 and hit[0]:
        return _verdict(nonce, "10")
    if len(answers) == 2 and hit[0] != hit[1]:
        return _verdict(nonce, "A" if hit[0] else "B")
    return fair(messages)
