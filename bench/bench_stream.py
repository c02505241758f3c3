"""Campaign scale from one file (issue 46): N small Cu cells streamed through
``alchemi-lit run`` with no sampler section, memory sampled as it runs.

    python bench/bench_stream.py                       # N = 1,000,000 EMT single points
    python bench/bench_stream.py --n 2000 --stage relax --kill-at 0.6

Writes N rattled 8-atom Cu cells into one extxyz file (once; kept in ``--dir``), runs
``alchemi-lit run`` on it in a subprocess (EMT, single points or a FIRE relaxation of
``--steps`` steps, a ZarrSink, no ``data.sampler``: the default budget) and every
``--every`` seconds records the resident memory of the run's process tree and how many
systems the store holds.  Prints the resident memory of the scan (before the first system
is stored) and while streaming (the first minute's level from the first stored system on,
the peak, the last; the issue's bar: within 200 MB of that level), the throughput
of each tenth of the systems (bar: the last tenth >= 90 % of the first), and whether
every structure is stored exactly once (read back from the store).  ``--kill-at F``
SIGKILLs the run (an out-of-memory kill cannot be caught either) once the store holds
``F * N`` systems, then resumes it with ``--resume``: nothing may be lost or doubled.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def write_cells(path: Path, n: int) -> None:
    """``n`` rattled 8-atom Cu cells, one extxyz file, written frame by frame."""
    import ase.io
    from ase.build import bulk

    base = bulk("Cu", "fcc", a=3.61, cubic=True) * (1, 1, 2)
    rng = np.random.default_rng(0)
    tmp = path.with_suffix(".part")
    with open(tmp, "w") as fh:
        for _ in range(n):
            a = base.copy()
            a.positions += rng.normal(scale=0.05, size=a.positions.shape)
            ase.io.write(fh, a, format="extxyz")
    tmp.rename(path)


def write_config(
    folder: Path, structures: Path, store: Path, stage: str, steps: int, n: int,
    max_atoms: int | None,
) -> Path:  # fmt: skip
    """The run: EMT, no data.sampler (the default budget), a ZarrSink that commits every
    hundredth of the systems at least (its default, 2048, for a million), so that the
    progress and a kill are seen at small N too."""
    import yaml

    if stage == "single":
        stages = [{"class_path": "alchemi_lit.workflows.jobs.SinglePoint"}]
    else:
        stages = [{"class_path": "FIRE", "init_args": {"fmax": 0.05, "max_steps": steps}}]
    sink = {"store": str(store), "mode": "w", "flush_every": min(2048, max(1, n // 100))}
    cfg = {
        "simulator": {
            "model": {"class_path": "EMT"},
            "stages": stages,
            "sinks": [{"class_path": "ZarrSink", "init_args": sink}],
            "accelerator": "cpu",
            "precision": "64",
            "seed": 0,
        },
        "data": {"structures": str(structures)},
    }
    if max_atoms is not None:  # (small trials: batches small enough to see a kill land)
        cfg["data"]["sampler"] = {"max_atoms": max_atoms}
    path = folder / "stream.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def stored(store: Path) -> int:
    """Systems the store has committed (0 before it exists)."""
    meta = store / "zarr.json"
    try:
        return int(json.loads(meta.read_text())["attributes"].get("n_systems", 0))
    except (OSError, ValueError, KeyError):
        return 0


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its children (0 once it is gone)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def run(argv: list[str], store: Path, every: float, samples: list, kill_at: int | None) -> bool:
    """Run ``alchemi-lit`` with ``argv``, sampling; True if it was killed at ``kill_at``."""
    cmd = [sys.executable, "-m", "alchemi_lit.cli", *argv]
    proc = subprocess.Popen(cmd, start_new_session=True)
    t0 = samples[-1][0] if samples else 0.0
    start = time.monotonic()
    killed = False
    while proc.poll() is None:
        time.sleep(every)
        now = t0 + time.monotonic() - start
        samples.append((now, tree_rss(proc.pid), stored(store)))
        if kill_at is not None and samples[-1][2] >= kill_at:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            killed = True
            break
    if not killed and proc.returncode != 0:
        raise SystemExit(f"alchemi-lit exited with {proc.returncode}")
    return killed


def report(samples: list, n: int, store: Path, runs: list[int] | None = None) -> None:
    """``runs``: the index of each run's first sample (a killed run and its resume)."""
    t = np.asarray([s[0] for s in samples])
    rss = np.asarray([s[1] for s in samples], dtype=float) / 2**20
    done = np.asarray([s[2] for s in samples])
    live = rss > 0
    # each run streams from its first newly stored system on; before it, the scan
    streaming = np.zeros(len(t), dtype=bool)
    for k, lo in enumerate(runs or [0]):
        hi = (runs or [0, len(t)])[k + 1] if k + 1 < len(runs or [0]) else len(t)
        grew = np.nonzero(done[lo:hi] > done[lo])[0]
        if grew.size:
            streaming[lo + grew[0] : hi] = True
    streaming &= live
    t0 = t[streaming][0] if streaming.any() else float("nan")
    level = rss[streaming & (t <= t0 + 60)].max() if streaming.any() else float("nan")
    scan = rss[live & ~streaming].max() if (live & ~streaming).any() else float("nan")
    peak = rss[streaming].max() if streaming.any() else float("nan")
    print(f"resident memory (MiB): scan (before the first stored system) peak {scan:.0f}; "
          f"streaming: first minute {level:.0f}, peak {peak:.0f}, last {rss[live][-1]:.0f}; "
          f"peak - first minute = {peak - level:.0f} (bar: <= 200)")  # fmt: skip
    first = int(np.argmax(done > 0))  # the first commit: start-up (the scan) is before it
    print(f"start-up (to the first stored system): {t[first]:.0f} s")
    rates = []
    for k in range(10):  # the first tenth counts from the first commit, not from start-up
        lo, hi = max(k * n // 10, int(done[first])), (k + 1) * n // 10
        a, b = max(int(np.searchsorted(done, lo)), first), int(np.searchsorted(done, hi))
        if b < len(t) and a < b:
            rates.append((int(done[b]) - int(done[a])) / max(t[b] - t[a], 1e-9))
    print("throughput per tenth (systems/s): " + ", ".join(f"{r:.0f}" for r in rates))
    if len(rates) == 10:
        print(f"last tenth / first tenth = {rates[-1] / rates[0]:.2f} (bar: >= 0.90)")
    from alchemi_lit.io.results_store import stored_system_ids

    ids = stored_system_ids(store)
    once = len(ids) == n and np.array_equal(np.sort(ids), np.arange(n))
    print(f"every structure stored once: {once} ({len(ids)} rows, {len(np.unique(ids))} ids)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import format_table  # writes this run's record (bench/records.py)

    killed = f"killed at {int(done[runs[1] - 1]):,}, resumed" if runs and len(runs) > 1 else "-"
    print(format_table(
        ["N", "structures/s (tenths)", "last / first tenth",
         "resident MiB: first minute / peak / last", "kill", "stored once", "wall s"],
        [[f"{n:,}", f"{min(rates):.0f}-{max(rates):.0f}" if rates else "-",
          f"{rates[-1] / rates[0]:.2f}" if len(rates) == 10 else "-",
          f"{level:.0f} / {peak:.0f} / {rss[live][-1]:.0f}", killed, str(once), f"{t[-1]:.0f}"]],
        title="Structures streamed from one file, no batch budget (bench_stream.py)",
    ))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=Path("bench_stream_work"))
    parser.add_argument("--stage", choices=("single", "relax"), default="single")
    parser.add_argument("--steps", type=int, default=5, help="FIRE steps (--stage relax)")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--kill-at", type=float, default=None, help="SIGKILL at this share")
    parser.add_argument(
        "--max-atoms", type=int, default=None,
        help="a data.sampler budget (default: none, the run's default budget)",
    )  # fmt: skip
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    structures = args.dir / f"cu8_{args.n}.extxyz"
    if not structures.exists():
        t = time.monotonic()
        write_cells(structures, args.n)
        print(f"wrote {structures} ({structures.stat().st_size / 2**20:.0f} MiB) in "
              f"{time.monotonic() - t:.0f} s")  # fmt: skip
    store = args.dir / "stream.zarr"
    cfg = write_config(args.dir, structures, store, args.stage, args.steps, args.n, args.max_atoms)
    samples: list = []
    kill_at = None if args.kill_at is None else int(args.kill_at * args.n)
    runs = [0]
    if run(["run", "--config", str(cfg)], store, args.every, samples, kill_at):
        print(f"killed (SIGKILL) with {stored(store)} of {args.n} systems stored; resuming")
        runs.append(len(samples))
        run(["run", "--config", str(cfg), "--resume"], store, args.every, samples, None)
    report(samples, args.n, store, runs)


if __name__ == "__main__":
    main()
