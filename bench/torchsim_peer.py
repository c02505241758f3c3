"""Drive TorchSim 0.6.x, which lives in its own Python 3.12 venv, from a benchmark.

TorchSim 0.6 needs Python >= 3.12; the main environment is 3.11 (where only 0.3.0
installs).  ``bash bench/setup_torchsim.sh`` makes the venv; :class:`TorchSimPeer`
starts ``_torchsim_worker.py`` there once and sends it JSON commands, so TorchSim's
timed runs can be interleaved with the other engines' in one benchmark.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


def torchsim_python() -> Path:
    """The venv's interpreter: ``$ALCHEMI_BENCH_TORCHSIM_PYTHON``, else
    ``$ALCHEMI_BENCH_VENVS/torchsim/bin/python`` (default root /tmp/alchemi_bench_venvs)."""
    explicit = os.environ.get("ALCHEMI_BENCH_TORCHSIM_PYTHON")
    if explicit:
        return Path(explicit)
    root = Path(os.environ.get("ALCHEMI_BENCH_VENVS", "/tmp/alchemi_bench_venvs"))
    return root / "torchsim" / "bin" / "python"


class PeerError(RuntimeError):
    pass


class TorchSimPeer:
    """One worker process holding the structures ``atoms`` (written exactly, float64)."""

    def __init__(self, atoms: list[Any], threads: int) -> None:
        from crystals import pack

        py = torchsim_python()
        if not py.exists():
            raise PeerError(
                f"no TorchSim venv at {py}: run `bash bench/setup_torchsim.sh` "
                f"(or set ALCHEMI_BENCH_TORCHSIM_PYTHON)"
            )
        self._tmp = tempfile.TemporaryDirectory(prefix="alchemi_bench_ts_")
        self.dir = Path(self._tmp.name)
        set_path = self.dir / "set.npz"
        np.savez(set_path, **pack(atoms))
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "PYTHONPATH": "",  # the venv's own packages only
        }
        self.log = open(self.dir / "stderr.txt", "w+")  # noqa: SIM115 - kept for the process
        self.proc = subprocess.Popen(
            [str(py), str(HERE / "_torchsim_worker.py"), str(set_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
            cwd=self.dir,
        )

    def call(self, cmd: str, **params: Any) -> dict[str, Any]:
        """Send one command, wait for its ``@@RESULT`` line; raise :class:`PeerError`."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **params}) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("@@RESULT "):
                res = json.loads(line[len("@@RESULT ") :])
                if not res.pop("ok"):
                    raise PeerError(f"TorchSim worker, {cmd}: {res['error']}\n{res['trace']}")
                return res
        self.log.seek(0)
        tail = "".join(self.log.readlines()[-15:])
        raise PeerError(f"TorchSim worker exited during {cmd!r} (exit {self.proc.wait()}):\n{tail}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self._tmp.cleanup()

    def __enter__(self) -> TorchSimPeer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
