"""Launch paths of a pipeline: a plain script (Fabric re-runs it for rank 1), torchrun,
the CLI, and a rank killed mid-run (the others must stop with an error, not hang).

Each test starts real processes (``tests/scripts/pipeline_script.py``); importing
Lightning Fabric costs a few seconds per process, so these are the slowest tests:
all are marked ``slow`` (``make test-slow``); the forked ranks of ``test_pipeline.py`` go
through the same Fabric launch in ``make test``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alchemi_lit.sinks import ZarrSink

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "pipeline_script.py"
N_SYSTEMS = 20


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    for key in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NODE_RANK",
        "GROUP_RANK",
    ):
        env.pop(key, None)  # never inherit a launcher's environment
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _plain(out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(SCRIPT), str(out), *extra]


def _torchrun(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={_free_port()}",
        "--monitor_interval=0.5",
        str(SCRIPT),
        str(out),
        *extra,
    ]


def _start(cmd: list[str], out: Path) -> subprocess.Popen:
    log = open(out / "log.txt", "wb")  # noqa: SIM115 - closed by _finish
    return subprocess.Popen(
        cmd, cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _finish(proc: subprocess.Popen, out: Path, timeout: float) -> tuple[int | None, str]:
    """Wait for ``proc``; kill its whole session if it outlives ``timeout``."""
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = None
    return rc, (out / "log.txt").read_text(errors="replace")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _assert_all_results(out: Path) -> None:
    stored = ZarrSink(out / "results.zarr").read_batch()
    assert stored is not None
    assert stored.system_id.tolist() == list(range(N_SYSTEMS))
    assert (out / "done.json").exists(), "rank 0 did not finish"
    assert not list(out.glob("results.rank*")), "per-rank stores left behind"


def _tail(log: str, n: int = 3000) -> str:
    return "\n".join(line for line in log.splitlines() if "| DEBUG" not in line)[-n:]


# ------------------------------------------------------------------ normal runs
@pytest.mark.slow
def test_plain_script_fabric_spawns_rank_1(tmp_path):
    """... and the command returns only after rank 1 has exited, even when rank 1 takes
    seconds longer to shut down than rank 0 (``--linger``)."""
    proc = _start(_plain(tmp_path, "--linger", "3"), tmp_path)
    rc, log = _finish(proc, tmp_path, 180)
    assert rc == 0, _tail(log)
    _assert_all_results(tmp_path)
    for r in (0, 1):
        assert not _alive(int((tmp_path / f"pid_rank{r}").read_text())), f"rank {r} still runs"
@pytest.mark.slow
def test_torchrun(tmp_path):
    proc = _start(_torchrun(tmp_path), tmp_path)
    rc, log = _finish(proc, tmp_path, 180)
    assert rc == 0, _tail(log)
    _assert_all_results(tmp_path)


# ------------------------------------------------------------------ a rank killed
def _kill_rank_1_mid_run(cmd: list[str], out: Path) -> tuple[int | None, str, float, int]:
    proc = _start(cmd, out)
    pids = [out / "pid_rank0", out / "pid_rank1"]
    deadline = time.monotonic() + 150
    while not all(p.exists() for p in pids):
        if proc.poll() is not None or time.monotonic() > deadline:
            rc, log = _finish(proc, out, 5)
            pytest.fail(f"the ranks did not start (rc={rc}):\n{_tail(log)}")
        time.sleep(0.1)
    time.sleep(0.5)  # a few exchange rounds in
    assert not (out / "done.json").exists(), "the run ended before the kill: make it slower"
    os.kill(int(pids[1].read_text()), signal.SIGKILL)
    t0 = time.monotonic()
    rc, log = _finish(proc, out, 60)
    return rc, log, time.monotonic() - t0, int(pids[0].read_text())
@pytest.mark.slow
def test_killed_rank_stops_plain_script_run(tmp_path):
    rc, log, elapsed, pid0 = _kill_rank_1_mid_run(_plain(tmp_path, "--slow", "0.05"), tmp_path)
    assert rc is not None, f"the surviving rank hung after rank 1 was killed:\n{_tail(log)}"
    assert rc != 0
    assert elapsed < 60
    assert not _alive(pid0)
    # rank 0 names the dead rank (unless Fabric's observer killed it first, then says so)
    assert "pipeline rank 1 failed" in log or "terminated with code" in log, _tail(log)
    assert not (tmp_path / "done.json").exists()
@pytest.mark.slow
def test_killed_rank_stops_torchrun(tmp_path):
    rc, log, elapsed, pid0 = _kill_rank_1_mid_run(_torchrun(tmp_path, "--slow", "0.05"), tmp_path)
    assert rc is not None, f"torchrun hung after rank 1 was killed:\n{_tail(log)}"
    assert rc != 0
    assert elapsed < 60
    assert not _alive(pid0)
    assert "pipeline rank 1 failed" in log or "rank: 1" in log, _tail(log)
    assert not (tmp_path / "done.json").exists()


# ------------------------------------------------------------------ the CLI
PIPELINE_CONFIG = """\
simulator:
  model:
    class_path: LennardJones
    init_args: {{epsilon: 0.0104, sigma: 3.40, cutoff: 6.0}}
  stages:
    - - class_path: FIRE
        init_args: {{fmax: 0.05, max_steps: 30}}
    - - class_path: Langevin
        init_args: {{dt: 2.0, temperature: 50.0, steps: 10}}
  strategy: pipeline
  devices: 2
  buffer: {{num_systems: 8, num_atoms: 200}}
  sync_every: 5
  timeout: 60
  sinks:
    - class_path: ZarrSink
      init_args: {{store: {store}, mode: w}}
data:
  structures: builtin:mixed_argon
  builtin_args: {{n_systems: {n}, min_atoms: 8, max_atoms: 40, seed: 5}}
  sampler: {{max_atoms: 200}}
"""
@pytest.mark.slow
def test_cli_pipeline(tmp_path):
    config = tmp_path / "pipe.yaml"
    store = tmp_path / "results.zarr"
    config.write_text(PIPELINE_CONFIG.format(store=store, n=N_SYSTEMS))
    # the console script: Fabric re-runs this very command line for rank 1
    exe = Path(sys.executable).parent / "alchemi-lit"
    if not exe.exists():
        found = shutil.which("alchemi-lit")
        assert found, "the alchemi-lit console script is not installed: pip install -e ."
        exe = Path(found)
    cli = [str(exe)]
    check = subprocess.run(
        [*cli, "validate", "--config", str(config)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, _tail(check.stdout + check.stderr)
    proc = subprocess.run(
        [*cli, "run", "--config", str(config)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 0, _tail(proc.stdout + proc.stderr)
    stored = ZarrSink(store).read_batch()
    assert stored is not None and stored.system_id.tolist() == list(range(N_SYSTEMS))
