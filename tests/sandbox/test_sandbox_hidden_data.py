"""posttrain's task data (hidden code tests, terminal checks) is never
reachable from a task, whatever the install layout: a wheel installed into a
fresh venv (the package then sits in the venv every task runs from), and
the editable dev layout with the checkout itself bound into the sandbox."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from posttrain import sandbox as sb

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "src" / "posttrain" / "domains" / "data"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox backends drop root; these layouts need it")


def markers() -> list[str]:
    """Distinctive strings of the hidden data: code-task prompts and a terminal check line."""
    tasks = json.loads((DATA / "code" / "tasks.json").read_text())
    return [tasks[0]["prompt"][:60], tasks[-1]["prompt"][:60]]


PROBE = textwrap.dedent("""
    import os, sys
    MARKERS = {markers!r}
    try:
        import posttrain
        print("IMPORTED", getattr(posttrain, "__file__", None))
    except ImportError:
        print("no import")
    hits = []
    own = os.path.realpath("probe.py")
    roots = ["/"] if {whole_fs} else [p for p in sys.path if os.path.isdir(p)]
    for top, dirs, files in (step for root in roots for step in os.walk(root)):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in ("/proc", "/sys", "/dev")]
        for name in files:
            path = os.path.join(top, name)
            wanted = any(k in path for k in ("posttrain", "/src/", "/domains/", "/venv"))
            wanted = wanted or name in ("tasks.json", "checker.py", "harness.py")
            if not wanted or os.path.islink(path) or os.path.realpath(path) == own:
                continue
            if not name.endswith((".json", ".py", ".txt", ".md", ".pth")):
                continue
            try:
                with open(path, errors="replace") as fh:
                    text = fh.read(4 << 20)
            except OSError:
                continue
            if any(m in text for m in MARKERS):
                hits.append(path)
    print("HITS", hits)
""")


def probe_req(python: str | None = None, whole_fs: bool = True) -> sb.ExecRequest:
    src = PROBE.format(markers=markers(), whole_fs=whole_fs)
    lim = sb.Limits(wall_s=120, cpu_s=120, memory_bytes=512 << 20)
    if python:  # a fresh interpreter (argv), as well as the warm one (python_main)
        return sb.ExecRequest(files={"probe.py": src}, argv=(python, "probe.py"), limits=lim)
    return sb.ExecRequest(files={"probe.py": src}, python_main="probe.py", limits=lim)


def assert_hidden(res: sb.ExecResult) -> None:
    assert res.status == "ok", res
    assert "no import" in res.text and "HITS []" in res.text, res.text


@pytest.fixture(scope="module")
def wheel_python(tmp_path_factory) -> str:
    """A fresh venv holding posttrain installed from a wheel (offline), plus pyseccomp for the workers."""
    work = tmp_path_factory.mktemp("wheel")
    os.chmod(work, 0o755)
    proj = work / "proj"
    shutil.copytree(REPO / "src", proj / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, proj / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        pip + ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(work / "dist"), str(proj)],
        check=True,
    )
    (wheel,) = (work / "dist").glob("posttrain-*.whl")
    venv = work / "venv"
    subprocess.run(
        [getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)], check=True
    )
    python = str(venv / "bin" / "python")
    subprocess.run(pip + ["--python", python, "install", "--no-deps", "--no-index", str(wheel)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    import pyseccomp

    shutil.copy(pyseccomp.__file__, site)
    assert (site / "posttrain" / "domains" / "data" / "code" / "tasks.json").is_file()  # the data IS in the venv
    return python


@root_only
@pytest.mark.parametrize("backend", ["forkserver", "bwrap", "unsafe"])
def test_wheel_install_hides_the_task_data(wheel_python, backend):
    if sb.probe().missing(backend):
        pytest.skip(f"{backend} unavailable")
    # unsafe has no file-system isolation: it hides the package from the task's python path
    # (a private mount namespace as root), not the rest of the host (other checkouts)
    whole_fs = backend != "unsafe"
    with sb.Pool(sb.SandboxConfig(backend=backend, workers=1, python=wheel_python)) as pool:
        assert_hidden(pool.run(probe_req(whole_fs=whole_fs)))
        assert_hidden(pool.run(probe_req(wheel_python, whole_fs=whole_fs)))


@root_only
@pytest.mark.parametrize("backend", ["forkserver", "bwrap"])
def test_editable_layout_hides_src_even_when_the_checkout_is_bound(backend):
    if sb.probe().missing(backend):
        pytest.skip(f"{backend} unavailable")
    with sb.Pool(sb.SandboxConfig(backend=backend, workers=1, ro_binds=(str(REPO / "src"),))) as pool:
        assert_hidden(pool.run(probe_req()))
        assert_hidden(pool.run(probe_req(sys.executable)))
