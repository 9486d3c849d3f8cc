"""Adversarial tests, one per property, on the default (fork-server) backend."""

from __future__ import annotations

import os
import socket
import textwrap

import pytest

from posttrain import sandbox as sb

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server backend needs root")

SECRET = "posttrain-test-secret-4242"


@pytest.fixture(scope="module")
def pool():
    os.environ["POSTTRAIN_TEST_SECRET"] = SECRET  # must never reach a task
    p = sb.Pool(sb.SandboxConfig(workers=1))
    assert p.backend == "forkserver"
    yield p
    p.close()
    os.environ.pop("POSTTRAIN_TEST_SECRET", None)


def py(pool, source: str, **limits) -> sb.ExecResult:
    req = sb.ExecRequest(files={"main.py": textwrap.dedent(source)}, python_main="main.py", limits=sb.Limits(**limits))
    return pool.run(req)


def sh(pool, script: str, **limits) -> sb.ExecResult:
    return pool.run(sb.ExecRequest(argv=("sh", "-c", script), limits=sb.Limits(**limits)))


def uid_processes(uid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    found.append(int(name))
            except FileNotFoundError:
                pass
    return found


def test_runs_as_non_root_without_capabilities(pool):
    res = sh(pool, "id -u; grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status")
    uid, cap, nnp = res.text.split("\n")[:3]
    assert res.status == "ok" and int(uid) != 0
    assert int(cap.split()[1], 16) == 0 and nnp.split()[1] == "1"


def test_no_network_loopback_listener_outside_is_unreachable(pool):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        res = py(
            pool,
            f"""
            import socket
            s = socket.socket(); s.settimeout(2)
            try:
                s.connect(("127.0.0.1", {port})); print("CONNECTED")
            except OSError as e:
                print("refused", e.errno)
        """,
        )
    finally:
        server.close()
    assert res.status == "ok" and "refused" in res.text and "CONNECTED" not in res.text


def test_no_writes_outside_the_work_directory(pool, tmp_path):
    host_file = tmp_path / "host.txt"
    host_file.write_text("original")
    targets = [
        "/etc/posttrain_x",
        "/usr/posttrain_x",
        "/posttrain_x",
        f"{os.path.realpath(os.sys.prefix)}/posttrain_x",
        str(host_file),
    ]
    res = py(
        pool,
        f"""
        import subprocess
        for path in {targets!r}:
            try:
                open(path, "w").write("pwned"); print("WROTE", path)
            except OSError as e:
                print("denied", path, e.errno)
        open("/task/ok.txt", "w").write("fine"); print("task ok")
        r = subprocess.run(["mount", "-o", "remount,rw", "/usr"], capture_output=True)
        print("remount", r.returncode)
    """,
    )
    assert res.status == "ok", res.stderr
    assert "WROTE" not in res.text and "task ok" in res.text and "remount 0" not in res.text
    assert host_file.read_text() == "original"
    assert not any(os.path.exists(t) for t in targets[:4])


def test_no_reading_shadow_or_parent_environment(pool):
    res = py(
        pool,
        """
        import os
        print("shadow", repr(open("/etc/shadow").read()[:20]))
        print("env", dict(os.environ))
        for pid in os.listdir("/proc"):
            if pid.isdigit() or pid == "self":
                try:
                    print("proc", pid, open(f"/proc/{pid}/environ").read())
                except OSError:
                    pass
    """,
    )
    assert res.status == "ok", res.stderr
    assert "root:" not in res.text and "shadow ''" in res.text
    assert SECRET not in res.text and SECRET not in res.stderr.decode()


def test_seccomp_blocks_namespace_and_mount_calls(pool):
    res = py(
        pool,
        """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print("unshare", libc.unshare(0x10000000), ctypes.get_errno())
        print("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None), ctypes.get_errno())
        print("ptrace", libc.ptrace(16, 1, 0, 0), ctypes.get_errno())
    """,
    )
    assert res.status == "ok", res.stderr
    assert res.text.split("\n")[:3] == ["unshare -1 1", "mount -1 1", "ptrace -1 1"]


def test_fork_bomb_is_contained_and_leaves_nothing(pool):
    uid = pool.worker_info()[0]["uid"]
    res = py(
        pool,
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """,
        wall_s=2,
        pids=32,
    )
    assert res.status in ("timeout", "killed")
    assert uid_processes(uid) == []
    assert sh(pool, "echo alive").text == "alive\n"


def test_memory_bomb_is_killed(pool):
    res = py(
        pool,
        """
        hog = []
        while True:
            hog.append(b"x" * (1 << 20))
    """,
        memory_bytes=64 << 20,
        wall_s=20,
    )
    assert res.status == "oom", (res.status, res.stderr[-300:])


def test_cpu_loop_is_killed_at_its_cpu_limit(pool):
    res = py(pool, "while True: pass\n", cpu_s=1, wall_s=30)
    assert res.status == "timeout" and "cpu" in res.error and res.signal == 24  # SIGXCPU


def test_sleep_is_killed_at_its_wall_limit(pool):
    res = sh(pool, "sleep 60", wall_s=1)
    assert res.status == "timeout" and "wall" in res.error


def test_output_flood_is_truncated(pool):
    res = py(
        pool, "import sys\nsys.stdout.write('x' * 5_000_000)\nsys.stderr.write('y' * 5_000_000)\n", output_bytes=65536
    )
    assert res.status == "ok"
    assert len(res.stdout) == 65536 and res.stdout_truncated
    assert len(res.stderr) == 65536 and res.stderr_truncated


def test_daemonised_children_are_gone_when_the_task_ends(pool):
    uid = pool.worker_info()[0]["uid"]
    res = py(
        pool,
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.closerange(0, 3)
                time.sleep(300)
            os._exit(0)
        print("parent done")
    """,
    )
    assert res.status == "ok" and res.text == "parent done\n"
    assert uid_processes(uid) == []


def test_next_task_sees_no_files_of_the_previous(pool):
    first = sh(pool, "echo leak > /task/leak; echo leak > /tmp/leak; echo leak > /dev/shm/leak; ls /task /tmp")
    assert first.status == "ok" and "leak" in first.text
    second = sh(pool, "ls -A /task /tmp /dev/shm")
    assert second.status == "ok" and "leak" not in second.text


def test_no_descriptor_is_inherited(pool):
    leaked = os.open("/etc/hostname", os.O_RDONLY)
    os.set_inheritable(leaked, True)
    try:
        res = py(pool, "import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))\n")
    finally:
        os.close(leaked)
    fds = eval(res.text)  # a list of ints printed by the task
    assert fds[:3] == [0, 1, 2] and len(fds) <= 4  # the 4th is listdir's own handle
    listed = sh(pool, "ls /proc/$$/fd").text.split()
    assert sorted(listed) == ["0", "1", "2"]


def test_file_size_limit(pool):
    res = py(pool, "open('/task/big', 'wb').write(b'x' * (4 << 20))\n", file_bytes=1 << 20)
    assert res.status == "failed" and b"File too large" in res.stderr


def test_mountinfo_and_cgroup_show_no_host_path_or_pid(pool):
    """Mount sources name no host folder (checkout, venv, session layers), and
    the cgroup namespace shows "/" instead of the trainer's pid."""
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    show = "cat /proc/self/mountinfo; echo ---; cat /proc/self/cgroup"
    with pool.session({"a.txt": "a"}) as s:
        assert s.run(sb.ExecRequest(argv=("true",))).ok
        s.snapshot()
        in_session = s.run(sb.ExecRequest(argv=("sh", "-c", show))).text
    for text in (sh(pool, show).text, in_session):
        mounts, cgroups = text.split("---\n")
        for host in (checkout, os.path.realpath(os.sys.prefix), "/tmp/", "posttrain-sandbox", "sessions"):
            assert host not in mounts, (host, mounts)
        assert "/task" in mounts and all(line.endswith(":/") for line in cgroups.splitlines()), cgroups
        assert str(os.getpid()) not in cgroups


def test_cpu_time_is_recorded_after_a_wall_kill(pool):
    res = py(pool, "while True: pass\n", wall_s=1, cpu_s=60)
    assert res.status == "timeout" and "wall" in res.error and res.cpu_s > 0
