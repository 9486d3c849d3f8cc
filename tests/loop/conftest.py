"""Fixtures of the loop tests."""

from __future__ import annotations

import pytest

from posttrain.types import Score


@pytest.fixture
def parity_domain(monkeypatch):
    """A procedural domain whose verifier pays for an odd-length answer: the micro model earns
    mixed rewards from the first step, so groups carry signal and the trainer steps."""
    from posttrain.domains import registry
    from posttrain.domains.base import ProceduralDomain

    class Parity:
        name, version = "parity", "1"

        def score(self, task, episode):
            return Score(float(len(episode.completion) % 2), reason="" if len(episode.completion) % 2 else "even")

    cls = type(
        "parity",
        (ProceduralDomain,),
        {
            "name": "parity",
            "category": "test",
            "generate": lambda self, rng, difficulty: (f"{rng.randint(0, 999)}+{rng.randint(0, 999)}=", "0"),
        },
    )
    dom = cls()
    dom.verifier = Parity()
    monkeypatch.setitem(registry._REGISTRY, "parity", dom)
    return "tasks.domains={parity: {difficulty: 1}}"
