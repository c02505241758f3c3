"""Run every benchmark in this folder, one after the other, and keep their output.

Run (from the repository root; ~25-35 minutes on 2 CPU cores, the soak test included)::

    python bench/run_all.py                     # everything, soak with 20 000 systems
    python bench/run_all.py --quick             # smaller soak (2 000 systems)
    python bench/run_all.py --only dynamics fused
    python bench/run_all.py --only lj_forces neighbors -- --no-wait
    python bench/run_all.py --only mlip_relax mlip_cell mace_nvt     # issues #17 and #18
    python bench/run_all.py --only mlip_relax mlip_cell mace_nvt -- --quick   # smoke run

The three MLIP benchmarks (SevenNet-0 relaxations with and without the cell, random
MACE-MP-0-small NVT) need TorchSim 0.6's venv (``bash bench/setup_torchsim.sh``; they
run without it, its rows skipped) and add roughly half an hour to an hour (an estimate
from the model's cost per atom, not measured yet).

Each benchmark runs as its own process (``python bench/<name>.py``, so thread
settings and imports do not leak between them); its output is echoed and also written
to ``bench/out/<name>.txt`` (``bench/out/`` is git-ignored).  Extra options after
``--`` go to every script (for example ``-- --no-wait``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = {
    "lj_forces": ["bench_lj_forces.py"],
    "neighbors": ["bench_neighbors.py"],
    "dynamics": ["bench_dynamics.py"],
    "fused": ["bench_fused.py"],
    "molecules": ["bench_molecules.py"],
    "pipeline": ["bench_pipeline.py"],
    "soak": ["bench_soak.py"],
    # SevenNet-0 / MACE on 24 real crystals against TorchSim 0.6 (its own venv, made by
    # bench/setup_torchsim.sh) and ASE
    "mlip_relax": ["bench_mlip_relax.py"],
    "mlip_cell": ["bench_mlip_relax.py", "--cell"],
    "mace_nvt": ["bench_mace_nvt.py"],
    # elastic tensors and phonons of 20 crystals: batched workflows vs ASE + phonopy (#28)
    "properties": ["bench_properties.py"],
}


def _gate_options(extra: list[str], flags: tuple[str, ...] = ()) -> list[str]:
    """The load-gate options in ``extra`` (``--no-wait``, ``--max-wait X``,
    ``--max-load X``, also as ``--opt=X``) and the given flags."""
    out: list[str] = []
    k = 0
    while k < len(extra):
        a = extra[k]
        if a == "--no-wait" or a in flags or a.startswith(("--max-wait=", "--max-load=")):
            out.append(a)
        elif a in ("--max-wait", "--max-load") and k + 1 < len(extra):
            out += [a, extra[k + 1]]
            k += 1
        k += 1
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, extra = argv[:k], argv[k + 1 :]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", choices=list(BENCHES), default=list(BENCHES))
    p.add_argument("--quick", action="store_true", help="soak with 2 000 systems")
    args = p.parse_args(argv)
    out_dir = HERE / "out"
    out_dir.mkdir(exist_ok=True)
    failed = []
    for name in args.only:
        cmd = [sys.executable, str(HERE / BENCHES[name][0]), *BENCHES[name][1:]]
        if name == "soak" and args.quick:
            cmd += ["--systems", "2000"]
        # bench_lj_forces.py and bench_neighbors.py take only the load-gate options
        # (and lj_forces --no-peers); the others take every extra option
        if name == "lj_forces":
            cmd += _gate_options(extra, ("--no-peers",))
        elif name == "neighbors":
            cmd += _gate_options(extra)
        else:
            cmd += extra
        print(f"\n===== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        with open(out_dir / f"{name}.txt", "w") as log:
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                log.write(line)
            rc = proc.wait()
        print(f"===== {name}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
