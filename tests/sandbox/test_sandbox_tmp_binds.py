"""A read-only bind below /tmp (a checkout, and its venv, under /tmp) stays visible
under the task's fresh /tmp, and stays read-only."""

from __future__ import annotations

import os
import tempfile

import pytest

from posttrain import sandbox as sb

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server backend needs root")


@pytest.fixture(scope="module")
def shared_dir():
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        os.chmod(d, 0o755)
        with open(os.path.join(d, "helper_mod.py"), "w") as f:
            f.write("VALUE = 41 + 1\n")
        os.chmod(os.path.join(d, "helper_mod.py"), 0o644)
        yield d


def _req(d: str) -> sb.ExecRequest:
    code = (
        f"import sys; sys.path.insert(0, {d!r}); import helper_mod; print(helper_mod.VALUE)\n"
        f"try:\n    open({d!r} + '/x', 'w')\nexcept OSError as e:\n    print('ro', e.errno)\n"
    )
    return sb.ExecRequest(files={"main.py": code}, python_main="main.py")


@root_only
@pytest.mark.parametrize("backend", ["forkserver", "bwrap"])
def test_bind_under_tmp_is_visible_and_read_only(shared_dir, backend):
    pool = sb.Pool(sb.SandboxConfig(backend=backend, workers=1, ro_binds=(shared_dir,)))
    try:
        result = pool.run(_req(shared_dir))
    finally:
        pool.close()
    assert result.ok, result
    lines = result.text.splitlines()
    assert lines[0] == "42"
    assert lines[1].startswith("ro ")
    assert not os.path.exists(os.path.join(shared_dir, "x"))
