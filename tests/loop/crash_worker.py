"""`posttrain train` as its own process, for the kill tests (tests/loop/test_crash_resume.py):
the CLI's `main` with one test domain registered first.

The domain, `parity`, pays for an odd-length answer, so the micro model earns mixed rewards
from the first step, every group carries signal and every step trains (a resumed run that
matched an uninterrupted one only because nothing trained would prove nothing).
"""

from __future__ import annotations

import sys

from posttrain.cli import main
from posttrain.domains import registry
from posttrain.domains.base import ProceduralDomain
from posttrain.types import Score


class Parity:
    name, version = "parity", "1"

    def score(self, task, episode):
        odd = len(episode.completion) % 2
        return Score(float(odd), reason="" if odd else "even")


class ParityDomain(ProceduralDomain):
    name = "parity"
    category = "test"

    def generate(self, rng, difficulty):
        return f"{rng.randint(0, 999)}+{rng.randint(0, 999)}=", "0"


if __name__ == "__main__":
    domain = ParityDomain()
    domain.verifier = Parity()
    registry._REGISTRY["parity"] = domain
    sys.exit(main(sys.argv[1:]))
