"""Beyond one machine: two-"node" launches on localhost equal the one-process run.

* torchrun multi-node: two ``torchrun --nnodes=2 --nproc_per_node=1`` launches meeting at
  a c10d rendezvous on 127.0.0.1 (gloo), as two machines of a cluster would;
* SLURM emulated: two plain processes given the variables ``srun`` sets (``SLURM_NTASKS``,
  ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_NNODES``,
  ``SLURM_NTASKS_PER_NODE``, ``SLURM_NODELIST``, ``SLURM_JOB_ID``), as Lightning Fabric's
  ``SLURMEnvironment`` reads them: two nodes of one task, and one node of two tasks.

Each launch runs ``tests/scripts/scale_script.py``: replicas and a pipeline with every
sink kind.  Rank 0 is the launched process itself there, so these are also the tests of
the returned Results of a multi-rank run with a ZarrSink (they once named the per-rank
store the merge had removed).  Real processes with Fabric imports: slow tier.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import alchemi_lit as al
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import read_results
from alchemi_lit.strategies.launchers import external_launch

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "scale_script.py"
N, KEPT = 16, 3
KINDS = ("none", "memory", "zarr", "chain")


LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "NODE_RANK", "GROUP_RANK")  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in LAUNCHER_VARS
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(commands: list[tuple[list[str], dict[str, str]]], out: Path, timeout: float) -> None:
    """Start every (command, env) at once; all must exit 0 within ``timeout``."""
    procs = []
    for i, (cmd, env) in enumerate(commands):
        log = open(out / f"log{i}.txt", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        procs.append((proc, log))
    failed = []
    for i, (proc, log) in enumerate(procs):
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p, _ in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            rc = "timeout"
        log.close()
        if rc != 0:
            failed.append(f"launch {i}: {rc}\n{(out / f'log{i}.txt').read_text()[-3000:]}")
    assert not failed, "\n".join(failed)


_REFERENCE: list = []


def reference():
    """The one-process fused run, in this process."""
    if not _REFERENCE:
        sim = al.Simulator(
            model=LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0),
            stages=FIRE(fmax=0.05, max_steps=25)
            + Langevin(dt=2.0, temperature=50.0, friction=0.02, steps=8),
            sync_every=4,
        )
        _REFERENCE.append(sim.run(SizeAwareSampler(mixed_argon(N, 8, 30, seed=4), max_atoms=200)))
    return _REFERENCE[0].batch


def _check(out: Path, world: int = 2) -> None:
    """Every run of the script returned usable Results equal to the one-process run."""
    ref = reference()
    for r in range(world):
        assert (out / f"rank{r}.json").exists(), f"rank {r} did not finish"
    for strategy in ("replicas", "pipeline"):
        for kind in KINDS:
            name = f"{strategy}-{kind}"
            got = np.load(out / f"{name}.npz")
            assert int(got["systems"]) == N, name
            assert int(got["rows"]) == len(got["system_id"]), name
            assert ".rank" not in str(got["text"]) and ".rank" not in " ".join(got["sinks"])
            ids = got["system_id"]
            if kind == "chain":  # the HostMemory's share; the rest is in the store
                writers = 2 if strategy == "replicas" else 1
                assert len(ids) == KEPT * writers, name
            else:
                assert ids.tolist() == list(range(N)), name
            rows = torch.searchsorted(ref.system_id, torch.from_numpy(ids))
            want = ref.select(rows)
            for field in ("positions", "velocities", "energy", "total_steps"):
                assert np.array_equal(got[field], getattr(want, field).numpy()), (name, field)
            if kind in ("zarr", "chain"):
                stored = read_results(out / f"{name}.zarr").system_id.tolist()
                if kind == "zarr":  # the returned Results are the store's systems
                    assert stored == ids.tolist(), name
                else:  # each system once, in memory or in the store
                    assert sorted(stored + ids.tolist()) == list(range(N)), name
                assert not list(out.glob(f"{name}.rank*")), "per-rank stores left behind"


@pytest.mark.slow
def test_torchrun_two_nodes(tmp_path):
    endpoint = f"127.0.0.1:{_free_port()}"
    node = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=alchemi-test",
        "--monitor_interval=0.5", str(SCRIPT), str(tmp_path),
    ]  # fmt: skip
    _launch([(node, _env()), (node, _env())], tmp_path, timeout=240)
    _check(tmp_path)


def _slurm_env(rank: int, nodes: int, per_node: int, port: int) -> dict[str, str]:
    return _env(
        SLURM_JOB_ID="4242", SLURM_JOB_NAME="alchemi-test", SLURM_NTASKS=str(nodes * per_node),
        SLURM_NNODES=str(nodes), SLURM_NTASKS_PER_NODE=str(per_node), SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank % per_node), SLURM_NODEID=str(rank // per_node),
        SLURM_NODELIST="localhost", MASTER_PORT=str(port),
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("nodes,per_node", [(2, 1), (1, 2)], ids=["2x1", "1x2"])
def test_slurm_emulated(tmp_path, nodes, per_node):
    port = _free_port()
    cmd = [sys.executable, str(SCRIPT), str(tmp_path)]
    _launch(
        [(cmd, _slurm_env(r, nodes, per_node, port)) for r in range(nodes * per_node)],
        tmp_path,
        timeout=240,
    )
    _check(tmp_path)


# ------------------------------------------------------------------ fast: the env reader
def test_slurm_variables_are_read_as_fabric_reads_them(monkeypatch):
    for k, v in _slurm_env(3, 2, 2, 1234).items():
        monkeypatch.setenv(k, v)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(k, raising=False)
    ext = external_launch()
    assert (ext.launcher, ext.rank, ext.local_rank) == ("slurm", 3, 1)
    assert (ext.world_size, ext.local_world_size, ext.num_nodes) == (4, 2, 2)
    env = ext.cluster_environment()
    assert (env.global_rank(), env.local_rank(), env.node_rank(), env.world_size()) == (3, 1, 1, 4)
    env.validate_settings(num_devices=ext.local_world_size, num_nodes=ext.num_nodes)
    with pytest.raises(ValueError, match=r"SLURM started 4 task\(s\).*--ntasks-per-node"):
        ext.refuse_world(2)


def test_interactive_slurm_jobs_and_torchrun_inside_srun(monkeypatch):
    for k in list(os.environ):
        if k.startswith("SLURM_") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
            monkeypatch.delenv(k)
    assert external_launch() is None
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")  # Fabric's way out of srun detection
    assert external_launch() is None
    monkeypatch.setenv("SLURM_JOB_NAME", "job")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    with pytest.raises(ValueError, match="--ntasks-per-node"):
        external_launch()
    for k, v in {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    ext = external_launch()  # torchrun inside a srun task: torchrun's ranks
    assert (ext.launcher, ext.rank, ext.world_size, ext.num_nodes) == ("torchrun", 1, 4, 2)


@pytest.mark.slow
def test_cli_replicas_summary_names_the_merged_store(tmp_path):
    """``alchemi-lit run`` of the shipped replicas config, Fabric re-running the console
    script for rank 1: the summary names the merged store, never a per-rank part, and
    counts every rank's systems."""
    import json
    import shutil

    exe = Path(sys.executable).parent / "alchemi-lit"
    exe = exe if exe.exists() else Path(shutil.which("alchemi-lit") or "alchemi-lit")
    store = tmp_path / "replicas.zarr"
    cmd = [
        str(exe), "run", "--config", str(ROOT / "configs" / "replicas.yaml"),
        "--simulator.sinks.0.init_args.store", str(store),
        "--data.builtin_args.n_systems", "12", "--data.builtin_args.max_atoms", "40",
        "--simulator.stages.0.init_args.max_steps", "20",
        "--simulator.stages.1.init_args.steps", "5", "--simulator.timeout", "60",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    flat = re.sub(r"[\s│]", "", proc.stdout)  # (rich folds long paths across rows)
    assert ".rank" not in flat, proc.stdout
    assert "replicas.zarr(ZarrSink" in flat, proc.stdout
    summary = json.loads((tmp_path / "replicas.summary.json").read_text())
    assert summary["systems"] == 12
    assert sorted(read_results(store).system_id.tolist()) == list(range(12))
    assert not list(tmp_path.glob("replicas.rank*"))
