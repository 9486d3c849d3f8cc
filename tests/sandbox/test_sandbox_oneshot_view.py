"""One-shot backends: the host cgroup path is hidden (bubblewrap), CPU time
survives a wall kill, and `unsafe` runs from a checkout in a 0700 folder or
refuses with one error naming the folder."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from posttrain import sandbox as sb
from posttrain.errors import ConfigError
from posttrain.sandbox.oneshot import UnsafeBackend

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="unsafe drops to uid nobody only when started as root")


def _pool(backend: str, **over) -> sb.Pool:
    missing = sb.probe().missing(backend)
    if missing:
        pytest.skip(f"{backend} unavailable: {missing}")
    return sb.Pool(sb.SandboxConfig(backend=backend, workers=1, **over))


@pytest.mark.parametrize("backend", ["bwrap", "unsafe"])
def test_cpu_time_is_recorded_after_a_wall_kill(backend):
    with _pool(backend) as p:
        res = p.run(
            sb.ExecRequest(
                files={"m.py": "while True: pass\n"}, python_main="m.py", limits=sb.Limits(wall_s=1, cpu_s=60)
            )
        )
    assert res.status == "timeout" and "wall" in res.error and res.cpu_s > 0


def test_bwrap_cgroup_namespace_hides_the_host_cgroup():
    with _pool("bwrap") as p:
        res = p.run(sb.ExecRequest(argv=("cat", "/proc/self/cgroup")))
    assert res.ok and all(line.endswith(":/") for line in res.text.splitlines()), res.text


@pytest.fixture
def private_venv():
    """A venv-like layout (a venv of the base interpreter) in a checkout under a 0700 folder
    (pytest's own tmp folders are 0700 too: this one sits in a searchable folder of /tmp)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        os.chmod(top, 0o755)
        private = Path(top) / "private"
        private.mkdir()
        venv = private / "checkout" / ".venv"
        subprocess.run(
            [getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)], check=True
        )
        os.chmod(private, 0o700)
        yield private, str(venv / "bin" / "python")


@root_only
def test_unsafe_runs_from_a_checkout_in_a_0700_folder(private_venv):
    _, python = private_venv
    with _pool("unsafe", python=python) as p:
        res = p.run(
            sb.ExecRequest(files={"m.py": "import os, sys\nprint(6 * 7, os.getuid(), sys.prefix)"}, python_main="m.py")
        )
        assert res.ok, res
        answer, uid, prefix = res.text.split()
        assert answer == "42" and uid != "0" and "private" not in prefix  # run from the staging bind
        fresh = p.run(sb.ExecRequest(argv=(python, "-c", "print('fresh')")))
        assert fresh.ok and fresh.text == "fresh\n", fresh


@root_only
def test_unsafe_without_a_private_mount_namespace_refuses_with_one_clear_error(private_venv):
    private, python = private_venv
    with pytest.raises(ConfigError) as info:
        UnsafeBackend(python, private_mounts=False)
    msg = str(info.value)
    assert f"cannot search {private} (mode 700)" in msg and f"chmod o+x {private}" in msg and python in msg
