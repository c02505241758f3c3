"""The numerics a run reports: the libraries and processor code paths that did its
arithmetic (issue #41), read from the libraries themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import torch

from alchemi_lit.core.environment import describe, numerics_environment


def test_torch_and_numpy_report_their_own_blas_and_kernels() -> None:
    env = numerics_environment()
    t, n = env["torch"], env["numpy"]
    assert t["version"] == torch.__version__
    assert t["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert f"BLAS_INFO={t['blas']}" in torch.__config__.show()
    assert n["version"] == np.__version__
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    assert n["blas"].startswith(str(blas["name"]))
    line = describe(env)
    assert torch.__version__ in line and np.__version__ in line
    json.dumps(env)  # (stored in summary.json and the results store)


def test_the_variables_that_steer_the_code_paths_are_reported() -> None:
    """Under ``ATEN_CPU_CAPABILITY=default`` and ``MKL_ENABLE_INSTRUCTIONS=SSE4_2`` the
    report says so: torch's generic kernels, MKL at SSE4.2 at most."""
    code = "import json; from alchemi_lit.core.environment import numerics_environment as e; print(json.dumps(e()))"  # noqa: E501
    steer = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **steer},
                         capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    env = json.loads(out.stdout)
    assert env["torch"]["cpu_capability"] == "DEFAULT"
    assert env["steering"] == {**env["steering"], **steer}
    if "mkl_kernels" in env["torch"]:
        assert env["torch"]["mkl_kernels"].startswith("SSE4_2")
