"""Shared structure builders and fixtures for the test-suite.

Plain functions (importable with ``from conftest import perturbed_argon``) build
small ``ase.Atoms`` test structures; every builder takes an explicit ``seed`` so a
test is reproducible.  Nothing here changes torch's global default dtype: tests pass
``dtype=torch.float64`` explicitly.

Argon conventions: fcc, a = 5.26 Å (nearest neighbours 3.72 Å), LJ ε = 0.0104 eV,
σ = 3.40 Å.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk
from ase.calculators.emt import EMT as _AseEMT
from ase.calculators.lj import LennardJones as _AseLJ

from alchemi_lit.models import LennardJones

# Test modules import helpers from each other across folders (tests/models takes
# test_pipeline's assert_same): every test folder is importable whatever subset of the
# suite is collected, as pytest would make it once that folder's tests are collected.
for _folder in sorted({p.parent for p in Path(__file__).parent.rglob("test_*.py")}):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

AR_A = 5.26
AR_EPSILON = 0.0104
AR_SIGMA = 3.40


# ------------------------------------------------------- comparing implementations
#: ulps a chain of correctly rounded operations and one sqrt may differ by between two
#: implementations that order or fuse them differently (each op <= 1/2 ulp, a handful
#: of them on any path compared here)
CHAIN_ULPS = 8
#: ulps a library's pow/exp/log may differ from another's: glibc, SLEEF, SVML and
#: numba's libm each claim <= 1 ulp; NumPy's and torch's SIMD paths are chosen by the
#: processor, so two libraries (or a CPU and a GPU) can sit on opposite sides
TRANSCENDENTAL_ULPS = 4


def assert_conditioned_close(
    a: torch.Tensor, b: torch.Tensor, gain: torch.Tensor | float = 0.0, *,
    scale: torch.Tensor | float | None = None, msg: str = "",
) -> None:  # fmt: skip
    """``a`` and ``b`` (two implementations of one formula) agree to rounding as the
    formula's conditioning carries it: elementwise
    ``|a - b| <= eps (CHAIN_ULPS + TRANSCENDENTAL_ULPS gain) (|a| + scale)``, where
    ``gain`` is the factor by which the formula amplifies a one-ulp difference in its
    library functions or a cancellation (the caller derives it and says why), and
    ``scale`` the size of the terms a value is a sum of (``|a|`` alone when None: no
    cancellation).  Same dtype, shape and NaNs; integer and boolean tensors (decisions)
    exactly equal."""
    assert a.dtype == b.dtype and a.shape == b.shape, msg
    if not a.is_floating_point():
        assert torch.equal(a, b), msg
        return
    nan = torch.isnan(a)
    assert torch.equal(nan, torch.isnan(b)), f"{msg}: NaN in one implementation only"
    finite = torch.isfinite(a)
    assert torch.equal(a[~finite & ~nan], b[~finite & ~nan]), f"{msg}: infinities differ"
    x, y = a[finite].double(), b[finite].double()
    eps = torch.finfo(a.dtype).eps
    gain_t = torch.as_tensor(gain, dtype=torch.float64).expand(a.shape)[finite]
    size = x.abs()
    if scale is not None:
        size = size + torch.as_tensor(scale, dtype=torch.float64).expand(a.shape)[finite]
    allowed = eps * (CHAIN_ULPS + TRANSCENDENTAL_ULPS * gain_t) * size
    excess = (x - y).abs() - allowed
    worst = int(excess.argmax()) if excess.numel() else 0
    assert excess.numel() == 0 or excess[worst] <= 0, (
        f"{msg}: |{x[worst].item()!r} - {y[worst].item()!r}| > {allowed[worst].item():.3g} "
        f"(gain {gain_t[worst].item():.3g})"
    )


def fire2_bias_gain(alpha: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """How much FIRE2's bias correction ``1 / (1 - q)``, ``q = (1 - alpha)**(n + 1)``,
    amplifies an ulp of pow: ``q / (1 - q)`` (about ``1 / ((n + 1) alpha)``)."""
    q = (1.0 - alpha.double()) ** (n + 1)
    return torch.where(q < 1, q / (1.0 - q), torch.zeros_like(q))


# ------------------------------------------------------------------ ASE references
class _StateCheckedByBits:
    """Mixin for an ASE calculator that serves as a reference: its state check first asks
    whether the atoms are, bit for bit, those of its last results -- nothing changed then,
    as ASE's own check (a tolerance comparison of every array, ~0.25 ms) would find -- and
    runs ASE's check otherwise.  ASE's optimizers and MD ask for forces, energy and stress
    three or four times a step."""

    atoms: Atoms | None

    def check_state(self, atoms: Atoms, tol: float = 1e-15) -> list[str]:
        last = self.atoms
        if last is not None and _same_bits(last, atoms):
            return []
        return super().check_state(atoms, tol)  # type: ignore[misc]


def _same_bits(a: Atoms, b: Atoms) -> bool:
    def same(x: np.ndarray, y: np.ndarray) -> bool:
        return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()

    return (
        same(a.cell.array, b.cell.array)
        and same(a.pbc, b.pbc)
        and a.arrays.keys() == b.arrays.keys()
        and all(same(value, b.arrays[name]) for name, value in a.arrays.items())
    )


class AseLJ(_StateCheckedByBits, _AseLJ):
    """ASE's LennardJones as a reference (its state checked by bits first)."""


class AseEMT(_StateCheckedByBits, _AseEMT):
    """ASE's EMT as a reference (its state checked by bits first)."""


# ------------------------------------------------------------------ code paths
@pytest.fixture(params=["cpu", "accelerator"])
def code_path(request):
    """Run the test on the CPU's shortcuts and on the accelerator's branches
    (:func:`alchemi_lit.testing.accelerator_path`): both must give what it checks."""
    from alchemi_lit.testing import accelerator_path

    if request.param == "cpu":
        yield request.param
    else:
        with accelerator_path():
            yield request.param


# ---------------------------------------------------------------------- builders
def rng_for(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def argon_bulk(repeat: int | Sequence[int] = 3, cubic: bool = True) -> Atoms:
    """Perfect fcc argon crystal (cubic cell, 4 atoms per repeat unit)."""
    atoms = bulk("Ar", "fcc", a=AR_A, cubic=cubic)
    return atoms.repeat(repeat)


def noisy_argon(
    seed: int | None, repeat: int | Sequence[int] = 1, noise: float = 0.05
) -> Atoms:
    """Cubic fcc argon with positions moved by N(0, ``noise`` Å) from
    ``np.random.default_rng(seed)`` (``seed=None``: the perfect crystal)."""
    atoms = argon_bulk(repeat)
    if seed is not None:
        rng = np.random.default_rng(seed)
        atoms.positions += rng.normal(scale=noise, size=atoms.positions.shape)
    return atoms


def copper_cells(n: int, seed: int = 1) -> list[Atoms]:
    """``n`` cubic 4-atom fcc Cu cells with Gaussian noise (σ = 0.03 Å): many tiny EMT
    systems, for campaign-scale tests."""
    base = bulk("Cu", "fcc", a=3.6, cubic=True)
    rng = rng_for(seed)
    out = []
    for _ in range(n):
        atoms = base.copy()
        atoms.positions += rng.normal(scale=0.03, size=atoms.positions.shape)
        out.append(atoms)
    return out


def perturbed_argon(
    n_systems: int = 1, repeat: int | Sequence[int] = 3, noise: float = 0.1, seed: int = 0
) -> list[Atoms]:
    """``n_systems`` copies of cubic fcc argon with Gaussian noise (σ = ``noise`` Å)."""
    rng = rng_for(seed)
    out = []
    for _ in range(n_systems):
        atoms = argon_bulk(repeat)
        atoms.positions += rng.normal(scale=noise, size=atoms.positions.shape)
        out.append(atoms)
    return out


def random_triclinic_cell(
    rng: np.random.Generator, length: tuple[float, float] = (3.0, 6.0), tilt: float = 0.35
) -> np.ndarray:
    """Random well-conditioned triclinic cell (rows are lattice vectors).

    Diagonal entries are drawn from ``length``; off-diagonal tilts are up to ``tilt``
    times the diagonal, in a random (not only lower-triangular) pattern.
    """
    diag = rng.uniform(*length, size=3)
    cell = np.diag(diag)
    cell += rng.uniform(-tilt, tilt, size=(3, 3)) * diag[:, None] * (1 - np.eye(3))
    return cell


def random_structure(
    n_atoms: int,
    cell: np.ndarray | None,
    pbc: bool | Sequence[bool],
    seed: int,
    symbol: str = "Ar",
    box: float = 6.0,
    outside: float = 0.0,
) -> Atoms:
    """Uniform random atoms; no minimum distance (for geometry-only tests).

    With a cell, positions are random fractional coordinates in
    ``[-outside, 1 + outside)`` (so ``outside > 0`` leaves atoms unwrapped); without
    one they fill a cube of side ``box``.
    """
    rng = rng_for(seed)
    if cell is None:
        pos = rng.uniform(0.0, box, size=(n_atoms, 3))
        return Atoms(f"{symbol}{n_atoms}", positions=pos, pbc=pbc)
    cell = np.asarray(cell, dtype=float)
    frac = rng.uniform(-outside, 1.0 + outside, size=(n_atoms, 3))
    return Atoms(f"{symbol}{n_atoms}", scaled_positions=frac, cell=cell, pbc=pbc)


def strained(atoms: Atoms, seed: int, amount: float = 0.08) -> Atoms:
    """Copy of ``atoms`` under a random (triclinic) homogeneous strain."""
    rng = rng_for(seed)
    eps = rng.uniform(-amount, amount, size=(3, 3))
    out = atoms.copy()
    out.set_cell(out.cell.array @ (np.eye(3) + eps), scale_atoms=True)
    return out


def triclinic_argon(
    repeat: int = 3, noise: float = 0.1, strain: float = 0.08, seed: int = 0
) -> Atoms:
    """Primitive (rhombohedral) fcc argon supercell, strained and perturbed."""
    atoms = strained(argon_bulk(repeat, cubic=False), seed, strain)
    atoms.positions += rng_for(seed + 1).normal(scale=noise, size=atoms.positions.shape)
    return atoms


def mixed_pbc_argon(
    pbc: Sequence[bool] = (True, False, True), repeat: int = 2, noise: float = 0.1, seed: int = 0
) -> Atoms:
    """Perturbed cubic argon with a full cell but periodic only along ``pbc``."""
    atoms = perturbed_argon(1, repeat, noise, seed)[0]
    atoms.pbc = pbc
    return atoms


def slab_argon(repeat: int = 2, layers: int = 2, noise: float = 0.1, seed: int = 0) -> Atoms:
    """Argon slab, pbc = (T, T, F), with a ZERO third cell vector (no vacuum given)."""
    atoms = perturbed_argon(1, (repeat, repeat, layers), noise, seed)[0]
    cell = atoms.cell.array.copy()
    cell[2] = 0.0
    atoms.set_cell(cell, scale_atoms=False)
    atoms.pbc = (True, True, False)
    return atoms


def cluster_argon(radius: float = 6.0, noise: float = 0.1, seed: int = 0) -> Atoms:
    """Argon ball cut from bulk: no cell, no periodicity."""
    big = argon_bulk(4)
    center = big.cell.array.sum(0) / 2
    keep = np.linalg.norm(big.positions - center, axis=1) <= radius
    pos = big.positions[keep] - center
    pos += rng_for(seed).normal(scale=noise, size=pos.shape)
    return Atoms(f"Ar{len(pos)}", positions=pos, pbc=False)


def mixed_structures(seed: int = 0) -> list[Atoms]:
    """One of each kind: cubic, triclinic, mixed-pbc, zero-vector slab, cluster."""
    return [
        perturbed_argon(1, 2, 0.15, seed)[0],
        triclinic_argon(3, 0.1, 0.08, seed + 10),
        mixed_pbc_argon((True, False, True), 2, 0.1, seed + 20),
        slab_argon(2, 2, 0.1, seed + 30),
        cluster_argon(6.0, 0.1, seed + 40),
    ]


# ------------------------------------------------------------ documented examples
DOCS_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_MARKER = re.compile(r"<!-- example: ([\w-]+) -->\n```python\n(.*?)```", re.S)


def doc_blocks() -> dict[str, str]:
    """The marked Python examples of README.md and docs/: ``<!-- example: NAME -->`` on
    the line before the fence; tests check what these blocks compute, run as written
    (no copies to drift).  A name marks one block only."""
    blocks: dict[str, str] = {}
    for page in [DOCS_ROOT / "README.md", *sorted((DOCS_ROOT / "docs").rglob("*.md"))]:
        for name, block in EXAMPLE_MARKER.findall(page.read_text()):
            if name in blocks:
                raise LookupError(f"two blocks are marked <!-- example: {name} --> ({page})")
            blocks[name] = block
    return blocks


def doc_block(name: str) -> str:
    """The block marked ``<!-- example: NAME -->`` in README.md or docs/."""
    blocks = doc_blocks()
    if name not in blocks:
        raise LookupError(
            f"no page marks a block <!-- example: {name} --> (marked: {sorted(blocks)})"
        )
    return blocks[name]


# ---------------------------------------------------------------------- fixtures
@pytest.fixture
def log_messages() -> Iterator[list[tuple[str, str]]]:
    """Collect loguru records as ``(level, message)`` while the test runs."""
    from loguru import logger

    records: list[tuple[str, str]] = []
    sink_id = logger.add(
        lambda msg: records.append((msg.record["level"].name, msg.record["message"])),
        level="DEBUG",
    )
    try:
        yield records
    finally:
        logger.remove(sink_id)


def price_bookkeeping_at_nothing(patch: pytest.MonkeyPatch) -> None:
    """Every bookkeeping costs nothing to ``sync_every="auto"``: it books as soon as it
    sees a finished system, whatever the machine's timings (an expensive model's case;
    the cost rule itself is tested with a fake clock in test_cadence.py)."""
    from alchemi_lit.engine.cadence import Cadence

    booked = Cadence.booked

    def free(self, seconds):
        booked(self, seconds)
        self.book_s = 0.0

    patch.setattr(Cadence, "booked", free)


# ------------------------------------------------------ the toy plugin distribution
# ``tests/plugin_pkg`` is a real distribution, ``alchemi-lit-toy``, with an
# ``alchemi_lit.plugins`` entry point.  For the tests that use it (those requesting the
# ``toy_plugin`` fixture of test_registry.py, or ``toy_plugin_site`` below), pip installs
# THIS checkout's copy with ``--target`` into a temporary directory, which goes first on
# ``sys.path`` and on ``PYTHONPATH`` (so subprocesses see it too) for the session and is
# removed afterwards.  importlib.metadata finds its ``.dist-info`` there, so entry-point
# discovery runs exactly as for a user's plugin, and nothing stays in the environment.
TOY_SRC = Path(__file__).resolve().parent / "plugin_pkg"
TOY_DIST = "alchemi-lit-toy"
TOY_FIXTURES = ("toy_plugin", "toy_plugin_site")
_toy: dict[str, object] = {}


def _install_toy_plugin() -> Path:
    """Install tests/plugin_pkg into a fresh temporary site (once per session)."""
    if "site" in _toy:
        return _toy["site"]  # type: ignore[return-value]
    tmp = Path(tempfile.mkdtemp(prefix="alchemi-lit-toy-"))
    src, site = tmp / "src", tmp / "site"
    # build from a copy: an in-tree build would leave build/ and *.egg-info in tests/
    shutil.copytree(
        TOY_SRC, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    args = ["install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation"]
    args += ["--target", str(site), str(src)]
    proc = None
    if importlib.util.find_spec("uv") is not None:  # (make installs it: 1 s, pip's 2.5 s)
        uv = [sys.executable, "-m", "uv", "pip", *args, "--python", sys.executable]
        proc = subprocess.run(uv, capture_output=True, text=True, timeout=300)
    if proc is None or proc.returncode != 0:
        cmd = [sys.executable, "-m", "pip", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"installing {TOY_SRC} failed:\n{proc.stdout}\n{proc.stderr}")
    _toy.update(tmp=tmp, site=site, pythonpath=os.environ.get("PYTHONPATH"))
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH")) if p
    )
    importlib.invalidate_caches()
    check_toy_plugin_is_ours(site)
    return site


def check_toy_plugin_is_ours(site: Path) -> None:
    """The ``alchemi-lit-toy`` that importlib.metadata resolves is the one in ``site``,
    built from this checkout (not one installed elsewhere, e.g. from another clone)."""
    dist = metadata.distribution(TOY_DIST)
    init = Path(str(dist.locate_file("alchemi_lit_toy/__init__.py"))).resolve()
    assert init.is_relative_to(site.resolve()), f"{TOY_DIST} resolves to {init}, not {site}"
    ours = (TOY_SRC / "alchemi_lit_toy" / "__init__.py").read_bytes()
    assert init.read_bytes() == ours, f"{init} differs from this checkout's {TOY_SRC}"
    module = sys.modules.get("alchemi_lit_toy")
    if module is not None:  # imported already (by the registry): from the same place
        assert Path(module.__file__).resolve() == init, (module.__file__, init)


def _uninstall_toy_plugin() -> None:
    site = _toy.pop("site", None)
    if site is None:
        return
    if str(site) in sys.path:
        sys.path.remove(str(site))
    old = _toy.pop("pythonpath")
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old  # type: ignore[assignment]
    sys.modules.pop("alchemi_lit_toy", None)
    importlib.invalidate_caches()
    shutil.rmtree(_toy.pop("tmp"), ignore_errors=True)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- models
class PoisonedLJ(LennardJones):
    """Argon LJ whose energy turns NaN for system 1 from the 4th evaluation on (what
    NaNGuard quarantines)."""

    def __init__(self, cutoff: float = 8.5) -> None:
        super().__init__(epsilon=AR_EPSILON, sigma=AR_SIGMA, cutoff=cutoff)
        self.calls = 0

    def forward(self, batch, *args, **kwargs):  # type: ignore[override]
        out = super().forward(batch, *args, **kwargs)
        self.calls += 1
        if self.calls > 3:
            out["energy"] = torch.where(batch.system_id == 1, float("nan"), out["energy"])
        return out


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # before any fixture runs: test_registry.py's session fixture then finds it installed
    if any(set(TOY_FIXTURES) & set(getattr(item, "fixturenames", ())) for item in items):
        _install_toy_plugin()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _uninstall_toy_plugin()


def add_entry_point(monkeypatch: pytest.MonkeyPatch, name: str, target: str) -> None:
    """Make ``importlib.metadata`` list one more ``alchemi_lit.plugins`` entry point
    (``target``: ``module:callable``), as if a package declaring it were installed."""
    from alchemi_lit.core import registry

    real = metadata.entry_points

    def entry_points(**kwargs: str) -> list[metadata.EntryPoint]:
        eps = list(real(**kwargs))
        if kwargs.get("group") == registry.ENTRY_POINT_GROUP:
            eps.append(metadata.EntryPoint(name, target, registry.ENTRY_POINT_GROUP))
        return eps

    monkeypatch.setattr(registry.metadata, "entry_points", entry_points)


@pytest.fixture(scope="session")
def toy_plugin_site() -> Path:
    """The temporary site directory holding this checkout's ``alchemi-lit-toy``."""
    return _install_toy_plugin()
