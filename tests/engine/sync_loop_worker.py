"""The closed loop under torchrun (trainer.fsdp) against a server: `torchrun ... sync_loop_worker.py OVERRIDE...`.

Registers the test domain `test_scale_short` (rewards short completions) in every
rank, then runs posttrain.loop.train with the given dotted overrides.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: serve_process, which test_engine_sync imports

from test_engine_sync import _ShortDomain  # noqa: E402

from posttrain.configs import load_config  # noqa: E402
from posttrain.domains import registry  # noqa: E402


def main(overrides: list[str]) -> int:
    from posttrain.loop import train

    dom = _ShortDomain()
    registry._REGISTRY[dom.name] = dom
    result = train(load_config(None, overrides), log=lambda *_: None)
    if result is not None:
        print(f"run directory: {result.run_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
