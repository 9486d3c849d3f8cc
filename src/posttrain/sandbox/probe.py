"""Start-up probe: what this machine offers the sandbox, and which backend to use.

Invariant: the probe only reports what it tested on this machine (a feature
is true only if it was exercised: a namespace unshared, a cgroup created and
removed, a seccomp filter built, bubblewrap run), and `select_backend` never
returns a backend that cannot enforce the limits unless the config named it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache

from posttrain.configs.sandbox import SandboxConfig
from posttrain.errors import ConfigError
from posttrain.sandbox import _cgroups

ENFORCES = {
    "forkserver": (
        "no network (net namespace)",
        "read-only root, tmpfs /task and /tmp (mount namespace)",
        "pid/ipc/uts namespaces",
        "non-root uid per slot, no capabilities",
        "seccomp filter",
        "cgroup memory (OOM kill)",
        "cgroup pids",
        "cgroup cpu quota",
        "rlimits cpu/fsize/as/nproc/nofile",
        "wall timer and output cap",
        "overlay snapshots",
        "warm in-process Python",
        "posttrain's package masked",
        "cgroup namespace; mountinfo without host paths",
        "session writes never follow a symlink",
    ),
    "bwrap": (
        "no network (net namespace)",
        "read-only root, tmpfs /tmp, host temp dir as /task",
        "pid/ipc/uts namespaces",
        "capabilities dropped (non-zero uid when root)",
        "rlimits cpu/fsize/as/nofile",
        "wall timer and output cap",
        "copy snapshots",
        "posttrain's package masked",
        "cgroup namespace",
        "session writes never follow a symlink",
    ),
    "unsafe": (
        "rlimits cpu/fsize/as/nofile",
        "wall timer and output cap",
        "copy snapshots",
        "posttrain's package masked (root only)",
        "session writes never follow a symlink",
    ),
}
NOT_ENFORCED = {
    "forkserver": (),
    "bwrap": (
        "cgroup memory: only RLIMIT_AS",
        "pids: only the pid namespace and the wall timer",
        "cpu quota",
        "seccomp",
        "mountinfo shows the host paths of its binds",
    ),
    "unsafe": ("network", "file system", "processes", "memory: only RLIMIT_AS", "everything else"),
}


@dataclass(frozen=True)
class Probe:
    root: bool
    namespaces: bool
    cgroup_version: int | None
    cgroup_writable: bool
    seccomp: bool
    overlay: bool
    bwrap: str | None
    bwrap_works: bool
    python: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    def missing(self, backend: str) -> list[str]:
        """What `backend` needs and this machine lacks (empty = usable)."""
        if backend == "forkserver":
            need = {
                "root": self.root,
                "namespaces": self.namespaces,
                "writable cgroup memory+pids+cpu": self.cgroup_writable,
                "seccomp (libseccomp2 + pyseccomp)": self.seccomp,
                "overlayfs": self.overlay,
                "an interpreter outside /root": not self.python.startswith("/root/"),
            }
        elif backend == "bwrap":
            need = {"bubblewrap (bwrap) that runs": self.bwrap_works}
        elif backend == "unsafe":
            need = {}
        else:
            raise ConfigError(f"sandbox.backend: unknown backend {backend!r}")
        return [name for name, ok in need.items() if not ok]

    def report(self) -> str:
        lines = [
            f"root: {self.root}",
            f"namespaces: {self.namespaces}",
            f"cgroups: v{self.cgroup_version} writable={self.cgroup_writable}"
            if self.cgroup_version
            else "cgroups: none usable",
            f"seccomp: {self.seccomp}",
            f"overlayfs: {self.overlay}",
            f"bubblewrap: {self.bwrap or 'not installed'} works={self.bwrap_works}",
            f"python: {self.python}",
        ]
        for name in ENFORCES:
            missing = self.missing(name)
            lines.append(
                f"backend {name}: {'available' if not missing else 'unavailable (missing: ' + ', '.join(missing) + ')'}"
            )
            lines.append("  enforces: " + "; ".join(ENFORCES[name]))
            if NOT_ENFORCED[name]:
                lines.append("  does not enforce: " + "; ".join(NOT_ENFORCED[name]))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _try_namespaces() -> bool:
    pid = os.fork()
    if pid == 0:
        try:
            from posttrain.sandbox import _linux

            _linux.unshare(
                _linux.CLONE_NEWNS
                | _linux.CLONE_NEWPID
                | _linux.CLONE_NEWNET
                | _linux.CLONE_NEWIPC
                | _linux.CLONE_NEWUTS
            )
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _try_cgroups(notes: list[str]) -> tuple[int | None, bool]:
    h = _cgroups.detect()
    if h is None:
        notes.append("no cgroup hierarchy holds memory, pids and cpu")
        return None, False
    tree = _cgroups.Tree(h, owner_pid=os.getpid())
    probe_cg = None
    try:
        tree.create(cpu_weight=100)
        probe_cg = tree.task("probe")
        probe_cg.create(64 << 20, 8, 1.0)
        return h.version, True
    except OSError as exc:
        notes.append(f"cgroup v{h.version} not writable: {exc}")
        return h.version, False
    finally:
        if probe_cg is not None:
            probe_cg.remove()
        tree.remove()


def _try_seccomp(notes: list[str]) -> bool:
    try:
        from posttrain.sandbox import _seccomp

        _seccomp.build()
        return True
    except Exception as exc:  # ImportError, OSError from a missing libseccomp
        notes.append(f"seccomp unavailable: {type(exc).__name__}: {exc}")
        return False


def bwrap_base_args(bwrap: str, root: bool) -> list[str]:
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if root:
        args += ["--unshare-user", "--uid", "65534", "--gid", "65534"]
    return args


def _try_bwrap(bwrap: str | None, root: bool, notes: list[str]) -> bool:
    if not bwrap:
        notes.append("bubblewrap not installed (apt-get install bubblewrap)")
        return False
    args = bwrap_base_args(bwrap, root) + ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    try:
        done = subprocess.run(args, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        notes.append(f"bubblewrap failed: {exc}")
        return False
    if done.returncode != 0:
        notes.append(f"bubblewrap failed: {done.stderr.decode(errors='replace').strip()}")
    return done.returncode == 0


@lru_cache(maxsize=4)
def probe(python: str = sys.executable) -> Probe:
    """Test this machine once per process (about 50-100 ms)."""
    notes: list[str] = []
    root = os.geteuid() == 0
    namespaces = root and _try_namespaces()
    version, writable = _try_cgroups(notes) if root else (None, False)
    overlay = "overlay" in open("/proc/filesystems").read()
    bwrap = shutil.which("bwrap")
    return Probe(
        root=root,
        namespaces=namespaces,
        cgroup_version=version,
        cgroup_writable=writable,
        seccomp=_try_seccomp(notes),
        overlay=overlay,
        bwrap=bwrap,
        bwrap_works=_try_bwrap(bwrap, root, notes),
        python=os.path.abspath(python),
        notes=tuple(notes),
    )


def select_backend(config: SandboxConfig, found: Probe) -> str:
    """The backend to use, or ConfigError naming what cannot be enforced."""
    if config.backend != "auto":
        missing = found.missing(config.backend)
        if missing:
            raise ConfigError(f"sandbox.backend={config.backend!r} cannot run here: missing {', '.join(missing)}")
        return config.backend
    missing = found.missing("forkserver")
    if not missing:
        return "forkserver"
    for weaker in config.accept_weaker:
        if not found.missing(weaker):
            return weaker
    raise ConfigError(
        f"sandbox.backend='auto': the fork-server cannot enforce every limit here (missing {', '.join(missing)}); "
        "set sandbox.accept_weaker to ['bwrap'] (or ['unsafe'] for tests) to accept weaker isolation"
    )
