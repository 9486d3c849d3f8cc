"""Reward functions a user would write (imported by path in the tests: byo_rewards:NAME)."""

import time


def exact_digits(completion, answer):
    return completion.strip() == str(answer)


def graded(completion, answer, **kwargs):
    ok = completion.strip() == str(answer)
    return {
        "value": 1.0 if ok else 0.25,
        "parts": {"length": min(len(completion), 10) / 10},
        "reason": "" if ok else "close",
    }


def raises(completion):
    raise RuntimeError("user bug")


def strict_int(completion, answer):
    """Raises on a completion that is no integer (a user's function that trusts its input)."""
    return int(completion.strip()) == int(answer)


def hangs(completion):
    time.sleep(60)
    return 1.0


def out_of_range(completion):
    return 7.5


not_callable = 3


def hangs_or_waits(completion):
    """`hang DIR`: hangs (after creating DIR/hanging); `wait DIR`: creates DIR/waiting, then
    returns 1.0 once DIR/release exists (a group-mate in flight while another call hangs)."""
    import pathlib

    what, folder = completion.split(" ", 1)
    folder = pathlib.Path(folder)
    (folder / ("hanging" if what == "hang" else "waiting")).touch()
    for _ in range(600):
        if what == "wait" and (folder / "release").exists():
            return 1.0
        time.sleep(0.1)
    return 0.0


def slow_but_in_time(completion):
    """Takes 2.5 s, within a 4 s time limit (the limit of a call that is not queued)."""
    time.sleep(2.5)
    return 1.0


def odd_length(completion):
    """1 for an answer of odd length: a random model earns mixed rewards, so a loop really trains."""
    return float(len(completion) % 2)
