"""A stand-in for `_mathverify.check` run in its real worker process (importable there: the
spawned worker gets the test's sys.path): `slow DIR` creates DIR/started and hangs, and any
other answer is equivalent exactly when it is the gold, bare or in parentheses."""

import pathlib
import time


def check(gold, answer):
    if answer.startswith("slow "):
        (pathlib.Path(answer[5:]) / "started").touch()
        time.sleep(120)
    return answer.strip("()") == gold
