"""Pools, sessions, worker replacement, backend selection, one-shot backends."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import pytest

from posttrain import sandbox as sb
from posttrain.errors import ConfigError, SandboxError

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server backend needs root")


@pytest.fixture(scope="module")
def pool():
    p = sb.Pool(sb.SandboxConfig(workers=2, domain_limits={"solo": 1}))
    yield p
    p.close()


def sh(script: str, **limits) -> sb.ExecRequest:
    return sb.ExecRequest(argv=("sh", "-c", script), limits=sb.Limits(**limits))


@root_only
def test_session_snapshot_and_restore(pool):
    with pool.session({"notes.txt": "one\n", "sub/keep.txt": "k"}) as s:
        assert s.run(sh("echo two >> notes.txt; rm sub/keep.txt; echo n > new.txt")).ok
        snap = s.snapshot()
        assert s.run(sh("echo three >> notes.txt; rm new.txt; mkdir d; echo x > d/x")).ok
        assert s.run(sh("cat notes.txt; ls")).text == "one\ntwo\nthree\nd\nnotes.txt\nsub\n"
        s.restore(snap)
        assert s.run(sh("cat notes.txt; ls -A; ls -A sub")).text == "one\ntwo\nnew.txt\nnotes.txt\nsub\n"
        s.restore(0)
        assert s.run(sh("cat notes.txt; ls sub")).text == "one\nkeep.txt\n"


@root_only
def test_session_files_are_private_to_the_session(pool):
    with pool.session({"a.txt": "a"}) as s:
        assert s.run(sh("echo secret > mine.txt")).ok
        assert "mine.txt" not in pool.run(sh("ls -A /task")).text


@root_only
def test_session_disk_is_size_limited(pool):
    with pool.session({}, disk_bytes=1 << 20) as s:
        res = s.run(sh("head -c 4000000 /dev/zero > big; echo rc=$?"))
        assert "rc=0" not in res.text


@root_only
def test_worker_killed_mid_task_is_infra_error_and_replaced():
    with sb.Pool(sb.SandboxConfig(workers=1, grace_s=5)) as p:
        old = p.worker_pids()[0]

        def kill_when_busy():
            for _ in range(2000):  # until the worker has forked the task tree
                try:
                    with open(f"/proc/{old}/task/{old}/children") as fh:
                        if fh.read().strip():
                            break
                except FileNotFoundError:
                    break
                time.sleep(0.005)
            os.kill(old, signal.SIGKILL)

        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        res = p.run(sh("sleep 30", wall_s=20))
        killer.join()
        assert res.status == "infra_error"
        with pytest.raises(SandboxError):
            sb.raise_for_infra(res)
        again = p.run(sh("echo back"))
        assert again.text == "back\n" and p.worker_pids() != [old] and p.stats().replaced == 1


@root_only
def test_runner_killed_mid_task_is_infra_error_and_the_worker_replaced():
    """The per-request runner (the worker's child) killed while its task runs:
    infra_error, never a score, and the slot gets a fresh worker."""
    with sb.Pool(sb.SandboxConfig(workers=1, grace_s=5)) as p:
        old = p.worker_pids()[0]

        def kill_runner():
            for _ in range(2000):  # until the worker has forked the runner
                with open(f"/proc/{old}/task/{old}/children") as fh:
                    runner = fh.read().split()
                if runner:
                    time.sleep(0.2)  # let it start the task
                    os.kill(int(runner[0]), signal.SIGKILL)
                    return
                time.sleep(0.005)

        killer = threading.Thread(target=kill_runner)
        killer.start()
        res = p.run(sh("sleep 30", wall_s=20))
        killer.join()
        assert res.status == "infra_error" and "worker died" in res.error
        again = p.run(sh("echo back"))
        assert again.text == "back\n" and p.worker_pids() != [old] and p.stats().replaced == 1


@root_only
def test_health_check_replaces_a_dead_idle_worker():
    with sb.Pool(sb.SandboxConfig(workers=1)) as p:
        old = p.worker_pids()[0]
        os.kill(old, signal.SIGKILL)
        time.sleep(0.2)  # let the kernel deliver the signal before pinging
        assert p.health_check() == 1
        assert p.worker_pids() != [old] and p.run(sh("true")).ok


@root_only
def test_domain_limit_caps_concurrency(pool):
    with pool.domain_slot("solo"):  # as a long run of domain "solo" would
        with pytest.raises(SandboxError, match="solo"):
            pool.run(sh("true"), domain="solo", timeout_s=0.2)
        assert pool.run(sh("true"), domain="other").ok  # other domains are not held back
    assert pool.run(sh("true"), domain="solo", timeout_s=5).ok


@root_only
def test_concurrent_mixed_load_has_no_infra_errors_and_cleans_up():
    import concurrent.futures

    reqs = [
        sh("echo ok"),
        sh("sleep 5", wall_s=0.3),
        sh("exit 2"),
        sb.ExecRequest(files={"m.py": "print(sum(range(10**5)))"}, python_main="m.py"),
    ] * 6
    with sb.Pool(sb.SandboxConfig(workers=2)) as p:
        tree_dirs = list(p._tree.roots.values())
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            results = list(ex.map(p.run, reqs))
        assert [r.status for r in results[:4]] == ["ok", "timeout", "failed", "ok"]
        assert all(r.status != "infra_error" for r in results) and results[-1].text == "4999950000\n"
    assert not any(os.path.exists(d) for d in tree_dirs)


@root_only
def test_async_run(pool):
    import asyncio

    async def two():
        return await asyncio.gather(pool.arun(sh("echo a")), pool.arun(sh("echo b"), domain="solo"))

    assert [r.text for r in asyncio.run(two())] == ["a\n", "b\n"]


@root_only
def test_worker_rss_is_small(pool):
    """The warm worker's peak RSS, and that of the per-request runners it forked, stay under 50 MiB."""
    for _ in range(4):  # some runs on each worker (the pool hands out its slots in turn)
        assert pool.run(sb.ExecRequest(files={"m.py": "print(1)"}, python_main="m.py")).ok
    infos = pool.worker_info()
    assert all(0 < info["runner_peak_rss_kb"] < 50 * 1024 for info in infos)
    assert all(info["peak_rss_kb"] < 50 * 1024 for info in infos)


@root_only
def test_collect_returns_files_but_not_links(pool):
    res = pool.run(
        sb.ExecRequest(
            argv=("sh", "-c", "echo out > result.txt; ln -s /etc/passwd link.txt"),
            collect=("result.txt", "link.txt", "missing.txt"),
        )
    )
    assert dict(res.files) == {"result.txt": b"out\n"}


@pytest.mark.parametrize("backend", ["unsafe", "bwrap"])
def test_one_shot_backends_run_and_limit(backend):
    found = sb.probe()
    if found.missing(backend):
        pytest.skip(f"{backend} unavailable: {found.missing(backend)}")
    with sb.Pool(sb.SandboxConfig(backend=backend, workers=1)) as p:
        ok = p.run(sb.ExecRequest(files={"m.py": "print(6 * 7)"}, python_main="m.py"))
        assert ok.status == "ok" and ok.text == "42\n" and ok.backend == backend
        assert p.run(sh("sleep 30", wall_s=0.5)).status == "timeout"
        assert p.run(sh("exit 3")).exit_code == 3
        assert p.run(sh("id -u")).text != "0\n"  # never root, even unsafe
        flood = p.run(
            sb.ExecRequest(
                files={"m.py": "print('x' * 10**6)"}, python_main="m.py", limits=sb.Limits(output_bytes=1000)
            )
        )
        assert len(flood.stdout) == 1000 and flood.stdout_truncated
        with p.session({"f.txt": "a\n"}) as s:
            s.run(sh("echo b >> f.txt"))
            snap = s.snapshot()
            s.run(sh("rm f.txt"))
            s.restore(snap)
            assert s.run(sh("cat f.txt")).text == "a\nb\n"


def test_bwrap_has_no_network_and_read_only_root():
    found = sb.probe()
    if found.missing("bwrap"):
        pytest.skip("bubblewrap unavailable")
    with sb.Pool(sb.SandboxConfig(backend="bwrap", workers=1)) as p:
        res = p.run(
            sh(
                "touch /usr/x 2>/dev/null && echo WROTE; cat /sys/class/net/*/operstate 2>/dev/null | tr '\\n' ' '; id "
                "-u"
            )
        )
        assert "WROTE" not in res.text and res.text.split()[-1] != "0"


def _probe(**over) -> sb.Probe:
    base = dict(
        root=True,
        namespaces=True,
        cgroup_version=1,
        cgroup_writable=True,
        seccomp=True,
        overlay=True,
        bwrap="/usr/bin/bwrap",
        bwrap_works=True,
        python="/usr/bin/python3",
    )
    base.update(over)
    return sb.Probe(**base)


def test_select_backend_never_downgrades_silently():
    assert sb.select_backend(sb.SandboxConfig(), _probe()) == "forkserver"
    weak = _probe(cgroup_writable=False)
    with pytest.raises(ConfigError, match="accept_weaker"):
        sb.select_backend(sb.SandboxConfig(), weak)
    assert sb.select_backend(sb.SandboxConfig(accept_weaker=("bwrap",)), weak) == "bwrap"
    with pytest.raises(ConfigError, match="cgroup"):
        sb.select_backend(sb.SandboxConfig(backend="forkserver"), weak)
    nonroot = _probe(root=False, namespaces=False, cgroup_version=None, cgroup_writable=False)
    with pytest.raises(ConfigError):
        sb.select_backend(sb.SandboxConfig(), nonroot)
    assert sb.select_backend(sb.SandboxConfig(backend="unsafe"), nonroot) == "unsafe"
    with pytest.raises(ConfigError, match="bubblewrap"):
        sb.select_backend(sb.SandboxConfig(backend="bwrap"), _probe(bwrap=None, bwrap_works=False))


def test_probe_report_lists_backends_and_what_they_enforce():
    text = sb.probe().report()
    for name in ("forkserver", "bwrap", "unsafe"):
        assert f"backend {name}:" in text
    assert "does not enforce" in text


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="workers"):
        sb.SandboxConfig(workers=0)
    with pytest.raises(ValueError, match="domain_limits"):
        sb.SandboxConfig(domain_limits={"code": 0})
    with pytest.raises(ValueError, match="backend"):
        sb.SandboxConfig(backend="docker")


def test_records_validate_fields():
    with pytest.raises(ValueError, match="memory_bytes"):
        sb.Limits(memory_bytes=0)
    with pytest.raises(ValueError, match="exactly one"):
        sb.ExecRequest()
    with pytest.raises(ValueError, match="relative"):
        sb.ExecRequest(files={"../x": "a"}, argv=("true",))
    with pytest.raises(ValueError, match="not in files"):
        sb.ExecRequest(python_main="m.py")
    with pytest.raises(ValueError, match="network"):
        sb.ExecRequest(argv=("true",), network="host")
    with pytest.raises(ValueError, match="status"):
        sb.ExecResult(status="fine")
    req = sb.ExecRequest(files={"a.py": "x"}, python_main="a.py")
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.stdin = b"x"
    assert sb.raise_for_infra(sb.ExecResult(status="failed")).status == "failed"
