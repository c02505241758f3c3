"""Run every benchmark in this folder, one after the other, and keep their output.

Run (from the repository root; ~20-30 minutes on 2 CPU cores, the soak test included)::

    python bench/run_all.py                     # everything, soak with 20 000 systems
    python bench/run_all.py --quick             # smaller soak (2 000 systems)
    python bench/run_all.py --only dynamics fused

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
    "dynamics": ["bench_dynamics.py"],
    "fused": ["bench_fused.py"],
    "pipeline": ["bench_pipeline.py"],
    "soak": ["bench_soak.py"],
}


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
        cmd = [sys.executable, str(HERE / BENCHES[name][0])]
        if name == "soak" and args.quick:
            cmd += ["--systems", "2000"]
        # bench_lj_forces.py has no load gate; the others take the extra options
        cmd += extra if name != "lj_forces" else [a for a in extra if a in ("--no-peers",)]
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
