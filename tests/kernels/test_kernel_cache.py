"""The compiled kernels' disk cache is keyed on every source they compile (issue #24).

numba's own ``cache=True`` checks only the file defining a kernel, so a kernel of
``kernels/dynamics.py`` that calls ``integrators/formulas.py`` kept its machine code
when the formula changed: a sign flipped in ``formulas.bussi_alpha`` passed the ASE
comparison with a warm cache.  These tests hold the key to every compiled source.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

numba = pytest.importorskip("numba")

from alchemi_lit.kernels import cache  # noqa: E402

KERNELS = cache.PACKAGE / "kernels"


def compiled_modules() -> list[Path]:
    """The kernel modules that compile something (use the keyed decorator)."""
    return [p for p in sorted(KERNELS.glob("*.py")) if "import compiled" in p.read_text()]


def imported_sources(path: Path) -> set[str]:
    """The package files (relative, like COMPILED_SOURCES) a kernel module imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.ImportFrom) and node.level):
            continue
        base = path.parent
        for _ in range(node.level - 1):
            base = base.parent
        target = base.joinpath(*node.module.split(".")) if node.module else base
        for alias in node.names:  # a submodule of a package, or a name of a module
            for candidate in (target / f"{alias.name}.py", target.with_suffix(".py"),
                              target / "__init__.py"):  # fmt: skip
                if candidate.is_file():
                    found.add(candidate.relative_to(cache.PACKAGE).as_posix())
                    break
    return found


def test_every_compiled_source_is_in_the_key():
    modules = compiled_modules()
    assert {p.name for p in modules} >= {"dynamics.py", "fire.py", "philox.py"}
    for path in modules:
        needed = {path.relative_to(cache.PACKAGE).as_posix()} | imported_sources(path)
        needed -= {"kernels/cache.py"}  # the decorator, not compiled code
        missing = needed - set(cache.COMPILED_SOURCES)
        assert not missing, f"{path.name} compiles {missing}: add to COMPILED_SOURCES"


def test_the_key_changes_with_any_compiled_source_only(tmp_path, monkeypatch):
    root = tmp_path / "pkg"
    for name in cache.COMPILED_SOURCES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(cache.PACKAGE / name, root / name)
    before = cache.source_digest(root)
    assert before == cache.source_digest(cache.PACKAGE)
    (root / "README.md").write_text("not compiled")
    assert cache.source_digest(root) == before
    for name in cache.COMPILED_SOURCES:
        original = (root / name).read_bytes()
        (root / name).write_bytes(original.replace(b"1.0", b"2.0", 1) + b"\n")
        assert cache.source_digest(root) != before, name
        (root / name).write_bytes(original)
    # another numba compiles other machine code from the same sources
    monkeypatch.setattr(numba, "__version__", numba.__version__ + ".post1")
    assert cache.source_digest(root) != before


def test_cache_root_is_numba_cache_dir_first(tmp_path, monkeypatch):
    """The user's NUMBA_CACHE_DIR wins over XDG_CACHE_HOME, which wins over ~/.cache."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "numba" / "alchemi_lit-kernels"
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    assert cache.cache_root() == tmp_path / "xdg" / "alchemi_lit-kernels"


def test_only_cache_folders_unused_for_a_week_are_removed(tmp_path):
    """Another source version's folder used within the week (another checkout, a run
    in progress) is kept; one untouched for longer goes; the current one stays."""
    import time

    current, recent, stale = (tmp_path / n for n in ("current", "recent", "stale"))
    for folder in (current, recent, stale):
        (folder / "k.nbi").parent.mkdir()
        (folder / "k.nbi").write_text("x")
    old = time.time() - cache.STALE_AFTER_S - 3600
    os.utime(stale, (old, old))
    os.utime(current, (old, old))  # (the current one is never removed, however old)
    cache._remove_stale(current)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "recent"]


def test_every_kernel_caches_in_the_keyed_folder():
    from alchemi_lit import kernels

    folder = str(cache.cache_dir())
    dispatchers = 0
    for path in compiled_modules():
        module = kernels.load(path.stem)
        for value in vars(module).values():
            if isinstance(value, numba.core.registry.CPUDispatcher):
                if value.targetoptions.get("inline") == "always":
                    continue  # scalar_xp's helpers: compiled into their callers
                dispatchers += 1
                assert value._cache._cache_path.startswith(folder), value
    assert dispatchers >= 15
    assert folder != numba.config.CACHE_DIR  # put back after decorating


#: one Bussi opening of one two-atom system through the compiled caller of bussi_alpha
CALLER = textwrap.dedent(
    """
    import numpy as np
    from alchemi_lit.kernels import dynamics
    ones = np.ones((2, 3))
    r, v, done = dynamics.bussi_kick_drift(
        np.zeros((2, 3)), 0.1 * ones, ones, np.full(2, 0.5), np.ones(1), np.ones(2),
        np.full(1, 0.9), np.full(1, 0.025), 0.3 * np.ones((2, 3)), np.zeros(1, np.int64),
        np.zeros(1, np.int64), 1, np.zeros(1, np.int64), np.full(1, 2, np.int64),
        np.ones(1, np.bool_), np.zeros(2, np.bool_),
    )
    assert done
    print(repr(float(v[0, 0])))
    """
)


@pytest.mark.slow
def test_a_formula_edited_under_a_warm_cache_is_recompiled(tmp_path):
    """End to end, as the mutation was found: warm the cache, flip a sign in
    ``formulas.bussi_alpha``, run again: the compiled caller gives the new value."""
    shutil.copytree(cache.PACKAGE, tmp_path / "alchemi_lit",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "c")}

    def run() -> float:
        out = subprocess.run([sys.executable, "-c", CALLER], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return float(out.stdout.split()[-1])

    first = run()
    assert run() == first  # warm
    formulas = tmp_path / "alchemi_lit" / "integrators" / "formulas.py"
    text = formulas.read_text()
    flipped = text.replace("+ 2.0 * r1 * xp.sqrt(c * term)", "- 2.0 * r1 * xp.sqrt(c * term)")
    assert flipped != text
    formulas.write_text(flipped)
    assert run() != first


def test_a_kernel_compiles_holding_its_lock_file(tmp_path):
    """While numba compiles (or loads) a signature, the kernel's lock file is taken
    for every other opener, another process's included; it is free again after."""
    fcntl = pytest.importorskip("fcntl")
    lock = tmp_path / "kernel.lock"

    def taken() -> bool:
        with open(lock, "a") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False

    kernel = numba.njit(lambda x: x + 1)
    seen, compile_ = [], kernel.compile
    kernel.compile = lambda sig: (seen.append(taken()), compile_(sig))[1]
    cache.one_process_at_a_time(kernel, lock)
    assert kernel(1) == 2 and kernel(2.5) == 3.5
    assert seen == [True, True] and not taken()


#: a process compiling one kernel signature: prints its cache misses and hits
COMPILER = textwrap.dedent(
    """
    import numpy as np
    from alchemi_lit.kernels import reductions as r
    f = np.ones((4, 3))
    r.max_sq_norm_below(f, np.array([0, 2]), np.array([2, 2]), 1.0)
    s = r.max_sq_norm_below.stats
    print(sum(s.cache_misses.values()), sum(s.cache_hits.values()))
    """
)


@pytest.mark.slow
def test_processes_starting_together_compile_each_kernel_once(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", COMPILER], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(3)]  # fmt: skip
    counts = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        counts.append(tuple(int(x) for x in out.split()))
    assert sorted(counts) == [(0, 1), (0, 1), (1, 0)]  # one compiled, two loaded
