"""Which numerical libraries and processor code paths a run used.

Why: two machines with the same package versions can round differently -- torch's
vectorised kernels follow the processor (``ATEN_CPU_CAPABILITY``), MKL takes its AVX-512
kernels on Intel processors and its AVX2 ones on AMD ones, NumPy's OpenBLAS picks a
kernel per core type -- so a user comparing results across machines needs these next to
the torch version.  The run summary (``summary.json``), the results store's run info
and the CLI's summary table carry them.  Nothing here changes a setting.
"""

from __future__ import annotations

import os
import platform
import re
from functools import lru_cache
from typing import Any

#: environment variables that steer those code paths, reported when set
STEERING = (
    "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE", "ATEN_CPU_CAPABILITY",
    "NPY_DISABLE_CPU_FEATURES", "OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "DNNL_MAX_CPU_ISA",
)  # fmt: skip


def processor() -> dict[str, Any]:
    """The processor's model name, vendor and widest x86 vector extension."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "vendor_id", "flags") and key not in info:
                    info[key] = value.strip()
                if len(info) == 3:
                    break
    except OSError:  # not Linux
        pass
    flags = set(info.get("flags", "").split())
    names = {"avx512f": "AVX512", "avx2": "AVX2", "avx": "AVX", "sse4_2": "SSE4_2"}
    widest = next((names[f] for f in names if f in flags), None)
    return {
        "model": info.get("model name") or platform.processor() or platform.machine(),
        "vendor": info.get("vendor_id"),
        "vector_extension": widest,
    }


def torch_numerics() -> dict[str, Any]:
    """torch's BLAS (name, version, the kernels MKL takes here) and kernel capability."""
    import torch

    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", config)
    out: dict[str, Any] = {
        "version": torch.__version__,
        "blas": blas.group(1) if blas else None,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if mkl:
        out["mkl_version"] = mkl.group(1)
        out["mkl_kernels"] = _mkl_kernels(processor())
    return out


def _mkl_kernels(cpu: dict[str, Any]) -> str | None:
    """The instruction set MKL dispatches to: its widest on Intel processors, AVX2 at
    most on others (MKL's rule), capped by ``MKL_ENABLE_INSTRUCTIONS`` (inferred: MKL
    inside torch exposes no query)."""
    widest = cpu.get("vector_extension")
    if widest is None:
        return None
    order = ["SSE4_2", "AVX", "AVX2", "AVX512"]
    level = order.index(widest) if widest in order else 0
    if cpu.get("vendor") != "GenuineIntel":
        level = min(level, order.index("AVX2"))
    cap = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "").upper()
    if cap.startswith("AVX512"):
        cap = "AVX512"
    if cap in order:
        level = min(level, order.index(cap))
    return order[level] + " (inferred from the processor and MKL_ENABLE_INSTRUCTIONS)"


def numpy_numerics() -> dict[str, Any]:
    """NumPy's BLAS (name, version, the core type OpenBLAS picked) and SIMD targets."""
    import numpy as np

    out: dict[str, Any] = {"version": np.__version__}
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        out["blas"] = f"{blas.get('name')} {blas.get('version')}".strip()
        out["simd"] = list(config["SIMD Extensions"].get("found", []))
    except Exception:  # an older or unusual build: report what can be had
        pass
    try:
        from threadpoolctl import threadpool_info

        for lib in threadpool_info():
            if lib.get("user_api") == "blas" and lib.get("architecture"):
                out["blas_core"] = lib["architecture"]
                break
    except Exception:  # threadpoolctl missing or a library it cannot read
        pass
    return out


def package_versions() -> dict[str, str]:
    """The versions of alchemi_lit and of the libraries that compute with it."""
    import ase
    import numpy
    import torch

    from .version import __version__

    return {
        "alchemi_lit": __version__, "torch": torch.__version__, "ase": ase.__version__,
        "numpy": numpy.__version__,
    }  # fmt: skip


@lru_cache(maxsize=1)
def numerics_environment() -> dict[str, Any]:
    """Processor, torch's and NumPy's numerics, and the variables that steer them."""
    return {
        "processor": processor(),
        "torch": torch_numerics(),
        "numpy": numpy_numerics(),
        "steering": {k: os.environ[k] for k in STEERING if k in os.environ},
    }


def describe(env: dict[str, Any]) -> str:
    """One line of :func:`numerics_environment` for a summary table."""
    t, n, cpu = env["torch"], env["numpy"], env["processor"]
    torch_part = f"torch {t['version']} ({t['blas']}"
    if t.get("mkl_kernels"):
        torch_part += f" {t['mkl_version']}, {t['mkl_kernels'].split(' ')[0]} kernels"
    torch_part += f"; ATen {t['cpu_capability']})"
    numpy_part = f"NumPy {n['version']} ({n.get('blas', '?')}"
    numpy_part += f", {n['blas_core']})" if n.get("blas_core") else ")"
    steering = ", ".join(f"{k}={v}" for k, v in env["steering"].items())
    return f"{torch_part}, {numpy_part} on {cpu['model']}" + (
        f"; {steering}" if steering else ""
    )


__all__ = [
    "describe", "numerics_environment", "numpy_numerics", "package_versions", "processor",
    "torch_numerics",
]  # fmt: skip
