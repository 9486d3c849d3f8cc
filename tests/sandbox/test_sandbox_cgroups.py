"""cgroup v1/v2 detection and control, on fake hierarchies (this machine has v1)."""

from __future__ import annotations

import os

from posttrain.sandbox import _cgroups

V1_CGROUP = "9:name=systemd:/\n8:pids:/\n4:memory:/job/abc\n1:cpu,cpuacct:/\n0::/\n"
V1_MOUNTS = (
    "cgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
    "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
)


def test_detect_v1_puts_the_tree_under_our_own_cgroup():
    h = _cgroups.detect(V1_CGROUP, V1_MOUNTS)
    assert h.version == 1
    assert h.dirs == {
        "memory": "/sys/fs/cgroup/memory/job/abc",
        "pids": "/sys/fs/cgroup/pids",
        "cpu": "/sys/fs/cgroup/cpu,cpuacct",
    }


def test_detect_v2(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    h = _cgroups.detect("0::/user.slice/me\n", f"cgroup2 {tmp_path} cgroup2 rw 0 0\n")
    assert h.version == 2 and h.dirs["pids"] == f"{tmp_path}/user.slice/me"


def test_detect_none_when_controllers_missing(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("hugetlb\n")
    assert _cgroups.detect("0::/\n", f"cgroup2 {tmp_path} cgroup2 rw 0 0\n") is None


def test_v2_tree_and_task_limits_on_a_fake_hierarchy(tmp_path):
    own = tmp_path / "me"
    own.mkdir()
    tree = _cgroups.Tree(
        _cgroups.Hierarchy(2, {c: str(own) for c in _cgroups.CONTROLLERS}), owner_pid=os.getpid(), tag="t"
    )
    tree.create(cpu_weight=50)
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    root = own / tree.name
    assert (root / "cpu.weight").read_text() == "50"
    task = tree.task("slot-0")
    task.create(128 << 20, 16, 0.5)
    d = root / "slot-0"
    assert (d / "memory.max").read_text() == str(128 << 20)
    assert (d / "pids.max").read_text() == "16"
    assert (d / "cpu.max").read_text() == "50000 100000"
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    assert task.oom_kills() == 2


def test_v1_memory_limit_order_keeps_memsw_above_limit(tmp_path):
    dirs = {c: str(tmp_path / c) for c in _cgroups.CONTROLLERS}
    task = _cgroups.TaskCgroup(1, dirs)
    for d in dirs.values():
        os.makedirs(d)
    mem = tmp_path / "memory"
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712")
    task.create(64 << 20, 8, 1.0)
    assert (mem / "memory.limit_in_bytes").read_text() == str(64 << 20)
    assert (mem / "memory.memsw.limit_in_bytes").read_text() == str(64 << 20)
    assert (tmp_path / "cpu" / "cpu.cfs_quota_us").read_text() == "100000"
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert task.oom_kills() == 5


def test_stale_trees_of_dead_owners_are_removed(tmp_path):
    stale = tmp_path / f"{_cgroups.TREE_PREFIX}999999999-0" / "slot-0"
    stale.mkdir(parents=True)
    live = tmp_path / f"{_cgroups.TREE_PREFIX}{os.getpid()}-0"
    live.mkdir()
    _cgroups.reap_stale(str(tmp_path))
    assert not stale.parent.exists() and live.exists()
