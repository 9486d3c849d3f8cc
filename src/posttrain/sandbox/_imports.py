"""What a sandboxed Python program can import: its work directory, the interpreter's
standard library and the packages its request declares (`ExecRequest.packages`, with
what they require), never the rest of the interpreter's site-packages.

Invariant: after `confine`, `sys.path` is the work directory and the standard
library's entries only; a top-level import outside them succeeds only for a declared
module (found in the interpreter's site-packages by the `Declared` finder, last on
`sys.meta_path`), and `importlib.metadata` sees only the declared distributions; no
module loaded before the program (by the worker, a `.pth` file, a pre-import) stays in
`sys.modules` unless it is the standard library's or declared. So a program's verdict
does not depend on what else happens to be installed beside posttrain (a program that
does `import pandas` fails the same way on every machine unless its domain declares
pandas). This module confines the import path; for a program that declares nothing
the fork-server and bubblewrap backends also mount an empty folder over the
interpreter's site-packages (so putting it back on `sys.path` finds nothing), while
one that declares packages can still read that folder.

Runs inside the sandbox and imports only the standard library: the fork-server's task
process calls `confine` before it runs the program (with the paths its worker found
once at start-up); the one-shot backends run this
file's text with `python -E -s -c`, followed by a call to `boot` (`boot_source`).
The host side (which modules and distributions a declaration means) is
`posttrain.sandbox.packages`.
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import re
import sys


def _norm(name: str) -> str:
    """A distribution's name as the packaging spec compares it (runs of `-_.` as one `-`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _site_like(path: str) -> bool:
    parts = path.replace("\\", "/").split("/")
    return "site-packages" in parts or "dist-packages" in parts


def stdlib_paths(paths) -> list[str]:
    """The entries of `paths` that hold the interpreter's standard library (its
    directory, lib-dynload, the zipped stdlib), none of a site-packages."""
    import sysconfig

    roots = {os.path.realpath(sysconfig.get_path(k)) for k in ("stdlib", "platstdlib")}
    zips = {os.path.dirname(r) for r in roots}
    out = []
    for p in paths:
        if not p or _site_like(p):
            continue
        real = os.path.realpath(p)
        if any(_under(real, r) for r in roots) or (p.endswith(".zip") and os.path.dirname(real) in zips):
            out.append(p)
    return out


def site_paths() -> list[str]:
    """The interpreter's site-packages directories (where declared packages are found)."""
    import site

    try:
        found = list(site.getsitepackages())
    except AttributeError:  # an interpreter built without it
        found = []
    return [p for p in found if os.path.isdir(p)]


class Declared:
    """A meta-path finder for the declared top-level modules, searched in site-packages,
    and a distribution finder for the declared distributions only."""

    def __init__(self, site, modules, dists) -> None:
        self.site = list(site)
        self.modules = frozenset(modules)
        self.dists = frozenset(dists)

    def find_spec(self, fullname, path=None, target=None):
        if path is not None or fullname not in self.modules:
            return None  # submodules come from their package's __path__
        return importlib.machinery.PathFinder.find_spec(fullname, self.site)

    def find_distributions(self, context=None):
        from importlib.metadata import DistributionFinder, MetadataPathFinder

        name = getattr(context, "name", None)
        if name is not None and _norm(name) not in self.dists:
            return iter(())
        found = MetadataPathFinder.find_distributions(DistributionFinder.Context(name=name, path=self.site))
        return (d for d in found if _norm(d.metadata["Name"] or "") in self.dists)

    def invalidate_caches(self) -> None:
        pass


def _stdlib_module(name: str, mod, std, homes) -> bool:
    where = getattr(mod, "__file__", None)
    if not where or name == "__main__":
        return True  # built in, frozen, or the running script
    return any(_under(where, p) for p in std) or any(_under(os.path.realpath(where), h) for h in homes)


def stdlib_modules(std) -> tuple[frozenset[str], frozenset[str]]:
    """The names in `sys.modules` now that the standard library (or the interpreter
    itself) provides, and the others: `confine` in a forked child need not look at
    either again."""
    homes = [os.path.realpath(p) for p in std if not p.endswith(".zip")]
    mods = list(sys.modules.items())
    ours = frozenset(n for n, m in mods if _stdlib_module(n, m, std, homes))
    return ours, frozenset(n for n, _ in mods) - ours


def confine(workdir: str, std, site, modules=(), dists=(), known=(frozenset(), frozenset())) -> None:
    """Cut this process's imports to `workdir`, the standard library's entries `std`
    (`stdlib_paths`) and the declared `modules` (top-level names) and `dists`
    (normalised names), found in `site` (`site_paths`); `known`: `stdlib_modules` as the
    process that forked this one found them."""
    std = list(std)
    sys.path[:] = [workdir] + std
    allowed = frozenset(modules)
    stdlib, foreign = known
    homes = None
    for name in [n for n in sys.modules if n not in stdlib]:
        if name.partition(".")[0] in allowed:
            continue
        if name not in foreign:  # loaded since: look where from
            homes = homes or [os.path.realpath(p) for p in std if not p.endswith(".zip")]
            if _stdlib_module(name, sys.modules[name], std, homes):
                continue
        del sys.modules[name]  # loaded from outside the stdlib and not declared
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, Declared)]
    if allowed or dists:
        sys.meta_path.append(Declared(site, allowed, dists))


def boot(main: str, modules=(), dists=()) -> None:
    """The one-shot backends' entry (after `python -E -s -c`): confine, then run `main`
    as __main__ with the interpreter's own handling of exits and uncaught errors."""
    import runpy

    confine(os.path.dirname(os.path.abspath(main)), stdlib_paths(sys.path), site_paths(), modules, dists)
    sys.argv = [main]
    runpy.run_path(main, run_name="__main__")


@functools.cache
def _text() -> str:
    """This module's text, read once."""
    with open(__file__, encoding="utf-8") as fh:
        return fh.read()


def boot_source(main: str, modules=(), dists=()) -> str:
    """The `-c` program of a one-shot Python run: this module's text and the call."""
    return f"{_text()}\nboot({main!r}, {tuple(modules)!r}, {tuple(dists)!r})\n"
