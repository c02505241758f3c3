"""SIGTERM and SIGINT never cost finished systems (issue #16, part 1).

Real processes, no Checkpoint callback, a buffering ZarrSink: the signal arrives
mid-run, after some systems finished.  Every finished system must be in the store,
the message must say where, and a resume (``resume=True``) must finish the run so
that the store equals an uninterrupted run's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alchemi_lit.data import SizeAwareSampler
from alchemi_lit.sinks import ZarrSink

SCRIPT = Path(__file__).parents[1] / "scripts" / "interrupt_script.py"
sys.path.insert(0, str(SCRIPT.parent))
import interrupt_script  # noqa: E402  (the run the child processes make)

pytestmark = [pytest.mark.slow, pytest.mark.multirank]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    sim = interrupt_script.simulator(out, pipeline=False, marker=None)
    sim.run(SizeAwareSampler(interrupt_script.data(), max_atoms=150))
    return ZarrSink(out / "results.zarr").read_batch()


def _start(out: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(out), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: a signal reaches every rank
    )


def _interrupt(out: Path, sig: int, *args: str) -> tuple[int, str]:
    proc = _start(out, *args)
    deadline = time.monotonic() + 120
    while not (out / "ready").exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "the run never got ready"
        time.sleep(0.02)
    if proc.poll() is not None:
        pytest.fail(f"the run ended before the signal: {proc.stderr.read().decode()[-2000:]}")
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err.decode()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("sig", "pipeline"),
    [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGTERM, True)],
    ids=["sigterm", "sigint", "sigterm-pipeline"],
)
def test_a_signal_without_checkpoint_keeps_every_finished_system(
    tmp_path, reference, sig, pipeline
):
    flag = ["--pipeline"] if pipeline else []
    rc, err = _interrupt(tmp_path, sig, *flag)
    assert rc != 0, err[-2000:]
    store = tmp_path / "results.zarr"
    saved = ZarrSink(store).read_batch()
    assert saved is not None and saved.num_systems >= interrupt_script.READY_AFTER, err[-3000:]
    assert saved.num_systems < len(interrupt_script.data())
    # each saved system is finished and equals the uninterrupted run's
    ref = reference.select([reference.system_id.tolist().index(s) for s in saved.system_id])
    interrupt_script.assert_same_results(ref, saved)
    text = (tmp_path / "interrupted.txt").read_text()
    assert text.splitlines()[0] == str(int(sig))
    assert signal.Signals(sig).name in text and str(store) in text, text
    # going on computes the others only; the store ends as the uninterrupted run's
    proc = _start(tmp_path, "--resume", *flag)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err.decode()[-3000:]
    interrupt_script.assert_same_results(reference, ZarrSink(store).read_batch())


CLI_CONFIG = """
simulator:
  model: {{class_path: LennardJones, init_args: {{epsilon: 0.0104, sigma: 3.40, cutoff: 6.0}}}}
  stages:
    - {{class_path: FIRE, init_args: {{fmax: 0.05, max_steps: 40}}}}
    - {{class_path: Langevin, init_args: {{dt: 2.0, temperature: {temperature}, steps: 400}}}}
  sinks:
    - {{class_path: ZarrSink, init_args: {{store: {store}, mode: w, flush_every: 1}}}}
  sync_every: 5
data:
  structures: builtin:mixed_argon
  builtin_args: {{n_systems: 40, min_atoms: 8, max_atoms: 30, seed: 5}}
  sampler: {{max_atoms: 120}}
"""


def _cli(config: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "alchemi_lit.cli", "run", "--config", str(config), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.timeout(300)
def test_cli_sigterm_without_checkpoint_then_resume(tmp_path):
    """The CLI exits 143 naming the store; a resume with another temperature is refused
    (and leaves the saved config alone); ``--resume`` finishes the run."""
    store = tmp_path / "res.zarr"
    config = tmp_path / "run.yaml"
    config.write_text(CLI_CONFIG.format(store=store, temperature=60.0))
    proc = _cli(config)
    deadline = time.monotonic() + 120
    while (not store.exists() or len(ZarrSink(store)) < 2) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert proc.poll() is None, "finished before the signal"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    text = err.decode()
    assert proc.returncode == 128 + signal.SIGTERM, text[-2000:]
    assert "interrupted by SIGTERM" in text and str(store) in text and "--resume" in text
    kept = ZarrSink(store).read_batch().system_id.tolist()
    saved_config = (tmp_path / "res.config.yaml").read_text()

    other = tmp_path / "other.yaml"
    other.write_text(CLI_CONFIG.format(store=store, temperature=90.0))
    refused = _cli(other, "--resume")
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == 2, err.decode()[-2000:]
    assert "temperature: 60.0 -> 90.0" in err.decode()
    assert (tmp_path / "res.config.yaml").read_text() == saved_config

    resumed = _cli(config, "--resume")
    _, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err.decode()[-2000:]
    final = ZarrSink(store).read_batch().system_id.tolist()
    assert final == list(range(40)) and set(kept) <= set(final)
