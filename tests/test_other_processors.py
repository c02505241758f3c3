"""The numerical tests pass on the code paths another processor would take (issue #24).

CI runs on one machine; users run on others of the same kind with Intel or AMD
processors, where NumPy's SIMD dispatch (AVX-512 pow and exp), torch's vectorised
kernels (``ATEN_CPU_CAPABILITY``) and the BLAS kernels behind both (OpenBLAS for NumPy
and SciPy, MKL for torch) take other code paths and round differently.  A test whose
tolerance is an ulp count rather than what the computation's conditioning allows passes
here and fails there.  This runs the tests that compare two implementations, two
libraries or a reference with us once with torch's libraries on their generic paths and
NumPy's on their native ones, and once the other way round -- so the two sides of each
comparison round as differently as this machine can make them, and once more with each
library at its AVX2 level.  (The other-way-up case, MKL's AVX-512 kernels, which it takes
on Intel processors only, is covered by construction -- no product spans systems,
:mod:`alchemi_lit.testing.blas` checks it on any processor -- and by the tolerances'
derivation, not by a run.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: the tests that compare implementations, libraries, or us with a reference
NUMERICS = [
    "tests/test_per_system.py",
    "tests/kernels",
    "tests/integrators",
    "tests/models",
    "tests/test_segments.py",
    "tests/test_convergence.py",
]


def numpy_dispatched_features() -> str:
    """The SIMD targets NumPy dispatches to on this processor (disabling them leaves
    its baseline code)."""
    from numpy._core import _multiarray_umath as umath

    found = umath.__cpu_features__
    return " ".join(f for f in umath.__cpu_dispatch__ if found.get(f))


def generic_torch() -> dict[str, str]:
    """torch's kernels on their generic (non-vectorised) path, MKL on SSE4.2."""
    return {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}


def baseline_numpy() -> dict[str, str]:
    """NumPy on its baseline SIMD, OpenBLAS (NumPy's, SciPy's) on an older core."""
    env = {"OPENBLAS_CORETYPE": "Nehalem"}
    features = numpy_dispatched_features()
    if features:
        env["NPY_DISABLE_CPU_FEATURES"] = features
    return env


def avx2_everywhere() -> dict[str, str]:
    """torch's AVX2 kernels, MKL at AVX2 at most, NumPy without its AVX-512 targets:
    the middle level each library offers on an AVX-512 processor."""
    env = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    wide = [f for f in numpy_dispatched_features().split() if "512" in f or f == "X86_V4"]
    if wide:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(wide)
    return env


#: what each run covers: the generic paths run the whole fast tier (issue #41: every
#: comparison that depends on the processor, not only those known to); the others the
#: tests that compare implementations
SUITES = {generic_torch: ["tests"], baseline_numpy: NUMERICS, avx2_everywhere: NUMERICS}


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("paths", list(SUITES))
def test_numerics_pass_on_another_processors_code_paths(paths):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **paths()}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         "-m", "not slow", "-n", "2", *SUITES[paths]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=2300,
    )  # fmt: skip
    settings = " ".join(f"{k}={v!r}" for k, v in paths().items())
    assert run.returncode == 0, f"with {settings}:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"
