"""Adversarial session steps: what one step leaves (symlinks, directories,
files in the way) can make a later step's request files fail with a reason,
never write outside the task (checked on the host), and base layers stay
as they were."""

from __future__ import annotations

import os

import pytest

from posttrain import sandbox as sb

BACKENDS = ["forkserver", "bwrap", "unsafe"]


@pytest.fixture(scope="module", params=BACKENDS)
def pool(request):
    missing = sb.probe().missing(request.param)
    if missing:
        pytest.skip(f"{request.param} unavailable: {missing}")
    p = sb.Pool(sb.SandboxConfig(backend=request.param, workers=1))
    yield p
    p.close()


@pytest.fixture
def host_dir(tmp_path):
    d = tmp_path / "host"
    d.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(d, 0o777)  # writable by anyone: only the sandbox's own care keeps writes out
    (d / "keep.txt").write_text("host original\n")
    os.chmod(d / "keep.txt", 0o666)
    return d


def sh(script: str, **files) -> sb.ExecRequest:
    return sb.ExecRequest(argv=("sh", "-c", script), files=files, limits=sb.Limits(wall_s=10))


def step_fails(s: sb.Session, files: dict, reason: str) -> None:
    res = s.run(sb.ExecRequest(argv=("true",), files=files))
    assert res.status == "failed", res
    assert reason in res.error and "cannot write" in res.error


def test_symlinked_directory_is_not_followed(pool, host_dir):
    with pool.session({"a.txt": "a"}) as s:
        assert s.run(sh(f"ln -s {host_dir} data")).ok
        step_fails(s, {"data/x.txt": "pwned"}, "symlink")
        step_fails(s, {"data/keep.txt": "pwned"}, "symlink")
        assert not (host_dir / "x.txt").exists() and (host_dir / "keep.txt").read_text() == "host original\n"
        ok = s.run(sh("cat a.txt", **{"other/y.txt": "fine"}))  # a later step succeeds on its own merits
        assert ok.ok and ok.text == "a"


def test_symlinked_file_is_not_followed(pool, host_dir):
    target = host_dir / "keep.txt"
    with pool.session({}) as s:
        assert s.run(sh(f"ln -s {target} notes.txt; ln -s {host_dir}/new.txt dangling.txt")).ok
        step_fails(s, {"notes.txt": "pwned"}, "symlink")
        step_fails(s, {"dangling.txt": "pwned"}, "symlink")
        assert target.read_text() == "host original\n" and not (host_dir / "new.txt").exists()


def test_proc_self_root_and_relative_escapes(pool, host_dir):
    with pool.session({}) as s:
        assert s.run(sh("ln -s /proc/self/root r; ln -s ../../../../../../.. up; ln -s /proc/self/cwd c")).ok
        for name in ("r", "up", "c"):
            step_fails(s, {f"{name}{host_dir}/x.txt": "pwned"}, "symlink")
        assert not (host_dir / "x.txt").exists()


def test_names_turned_into_directories_and_files_in_the_way(pool):
    with pool.session({"f.txt": "f", "d/inner.txt": "i"}) as s:
        assert s.run(sh("rm f.txt; mkdir -p f.txt/sub; rm -r d; echo plain > d; mkfifo pipe")).ok
        step_fails(s, {"f.txt": "x"}, "directory")
        step_fails(s, {"d/inner.txt": "x"}, "non-directory")
        step_fails(s, {"pipe": "x"}, "special file")  # would block a root writer if opened
        s.snapshot()  # a copy snapshot skips the FIFO instead of blocking on it
        res = s.run(sh("cat d; ls f.txt", **{"fresh.txt": "ok"}))
        assert res.ok and res.text == "plain\nsub\n"


def test_a_symlink_loop_is_the_step_failure_not_infra(pool):
    with pool.session({}) as s:
        assert s.run(sh("ln -s loop2 loop1; ln -s loop1 loop2")).ok
        step_fails(s, {"loop1/x": "x"}, "symlink")
        assert s.run(sh("true")).ok


def test_regular_files_are_replaced_and_restore_zero_gives_the_base(pool):
    with pool.session({"notes.txt": "base\n"}) as s:
        assert s.run(sh("ln notes.txt alias.txt")).ok  # a hard link must not carry the new contents
        res = s.run(sh("cat notes.txt alias.txt", **{"notes.txt": "step\n"}))
        assert res.ok and res.text == "step\nbase\n"
        s.restore(0)
        assert s.run(sh("cat notes.txt; ls -A")).text == "base\nnotes.txt\n"


def _layer_paths(pool, s: sb.Session) -> list[str]:
    """Where the session's base (and frozen layers) live on the host side."""
    if s.dir is not None:
        return [os.path.join(s.dir, "snap0"), os.path.join(s.dir, "snap1")]
    state = pool._workers[s.slot].conf["state_dir"]
    return [f"{state}/sessions/{s.sid}/base", f"{state}/sessions/{s.sid}/layers/0"]


def test_writes_aimed_at_base_layers_land_nowhere(pool):
    with pool.session({"base.txt": "b"}) as s:
        assert s.run(sh("echo one > one.txt")).ok
        snap = s.snapshot()
        base, layer = _layer_paths(pool, s)
        assert s.run(sh(f"ln -s {base} b; ln -s {layer} l; ln -s ../snap0 rel")).ok
        for name in ("b", "l", "rel"):
            step_fails(s, {f"{name}/injected.txt": "x"}, "symlink")
        s.restore(snap)
        assert s.run(sh("ls -A")).text == "base.txt\none.txt\n"
        s.restore(0)
        assert s.run(sh("ls -A")).text == "base.txt\n"


def test_collect_never_reads_through_a_symlinked_directory(pool, host_dir):
    (host_dir / "secret.txt").write_text("host secret\n")
    with pool.session({}) as s:
        assert s.run(sh(f"ln -s {host_dir} out")).ok
        res = s.run(sb.ExecRequest(argv=("true",), collect=("out/secret.txt",)))
        assert res.ok and dict(res.files) == {}
