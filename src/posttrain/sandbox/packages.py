"""What a request's declared packages mean (host side): the top-level modules and the
distributions a sandboxed program may import, found in the interpreter's site-packages
with everything they require.

Invariant: `resolve(names, site)` is a pure function of the names and the installed
distributions' metadata (cached per pool): each name is an import name (`numpy`,
`manifold3d`) or a distribution name (`scikit-learn`); the closure follows each
distribution's `Requires-Dist` (extras aside, markers evaluated where `packaging` is
installed, and a requirement that is not installed skipped: the package imports as
it would on a machine without it); a name no installed distribution provides raises
SandboxError naming it (an environment missing what a domain needs is the sandbox's
failure, never the program's); posttrain's own package and the benchmark packages
(`_hide`) are never allowed. The sandbox side is `posttrain.sandbox._imports`.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import re

from posttrain.errors import SandboxError
from posttrain.sandbox import _hide
from posttrain.sandbox._imports import _norm

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_REQ = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def top_levels(dist: md.Distribution) -> set[str]:
    """The top-level import names a distribution installs."""
    text = dist.read_text("top_level.txt")
    if text:
        return {ln.strip() for ln in text.splitlines() if ln.strip().isidentifier()}
    out = set()
    for f in dist.files or ():
        parts = f.parts
        if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith((".dist-info", ".egg-info", ".data")):
            continue
        head = parts[0] if len(parts) > 1 else parts[0].split(".")[0]
        if len(parts) == 1 and not parts[0].endswith((".py", ".so", ".pyd")):
            continue
        if head.isidentifier():
            out.add(head)
    return out


def _wanted(requirement: str) -> str | None:
    """The distribution a Requires-Dist line needs here, or None (an extra, a false marker)."""
    name, _, marker = requirement.partition(";")
    m = _REQ.match(name)
    if not m:
        return None
    marker = marker.strip()
    if marker:
        if "extra" in marker:
            return None
        try:
            from packaging.markers import Marker
        except ImportError:  # no way to evaluate it: include what is installed
            return m.group(1)
        try:
            if not Marker(marker).evaluate():
                return None
        except Exception:  # an unparsable marker: include what is installed
            pass
    return m.group(1)


@functools.lru_cache(maxsize=128)
def resolve(names: tuple[str, ...], site: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(top-level modules, normalised distribution names) a declaration allows."""
    if not names:
        return (), ()
    dists: dict[str, md.Distribution] = {}
    for d in md.distributions(path=list(site)):
        key = _norm(d.metadata["Name"] or "")
        if key and key not in dists and not _hide._ours(key.replace("-", "_")):
            dists[key] = d
    tops = {key: top_levels(d) for key, d in dists.items()}
    todo = []
    for name in names:
        if not NAME.match(name):
            raise SandboxError(f"declared package {name!r} is not a package name")
        found = [key for key, mods in tops.items() if name in mods] or ([_norm(name)] if _norm(name) in dists else [])
        if not found:
            raise SandboxError(
                f"the program declares package {name!r}, which is not installed in the sandbox's interpreter "
                f"(site-packages: {', '.join(site) or 'none'}); install it or drop the declaration (docs/sandbox.md)"
            )
        todo += found
    seen: set[str] = set()
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        for requirement in dists[key].requires or ():
            want = _wanted(requirement)
            if want and _norm(want) in dists:
                todo.append(_norm(want))
    modules = sorted({m for key in seen for m in tops[key]})
    return tuple(modules), tuple(sorted(seen))
