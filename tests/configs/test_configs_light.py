"""The configs sit at the bottom: importing `posttrain.configs` (the root config and every
section) imports no torch and no part of posttrain above it, only `errors`."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import json, sys
import posttrain.configs
from posttrain.configs import Config
Config()  # every section's defaults build
print(json.dumps(sorted(m for m in sys.modules if m == "torch" or m.startswith("posttrain"))))
"""


def test_importing_the_configs_imports_no_torch_and_no_part():
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    loaded = json.loads(res.stdout)
    assert "torch" not in loaded
    above = [m for m in loaded if m not in ("posttrain", "posttrain.errors") and not m.startswith("posttrain.configs")]
    assert above == [], f"importing posttrain.configs imports {above}"
    assert "posttrain.configs.trainer" in loaded and "posttrain.configs.base" in loaded
