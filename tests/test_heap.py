"""heap.kept_heap: inside a run on the CPU, freed large blocks stay in the heap (no
mmap per allocation) and the settings come back afterwards; the run loop uses it
unless ``reuse_cpu_memory=False``.  The probes run in a fresh interpreter
(tests/heap_checks.py): an earlier test's heap holes would serve them otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from alchemi_lit.core import heap

pytestmark = pytest.mark.skipif(not heap.supported(), reason="needs Linux with glibc")


@pytest.fixture(scope="module")
def seen() -> dict:
    script = Path(__file__).with_name("heap_checks.py")
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=env, timeout=120, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_large_blocks_come_from_the_heap_only_inside(seen) -> None:
    assert seen["default"] == 1  # glibc's default: its own mmap
    assert seen["active"] is True
    assert seen["inside"] == 0 and seen["inside_after_inner"] == 0  # re-entrant
    assert seen["after"] == 1
    # afterwards glibc is left as its dynamic rule leaves a process that freed large
    # tensors (not at its fixed 128 KiB defaults, which would slow whatever runs next)
    assert seen["after_medium"] == 0
    assert seen["disabled_active"] is False and seen["disabled"] == 1


@pytest.mark.parametrize("reuse", [True, False])
def test_the_run_loop_keeps_the_heap_on_cpu_unless_told_not_to(seen, reuse) -> None:
    run = seen["runs"][str(reuse)]
    assert run["systems"] == 2 and run["finite"]
    assert run["calls"] == [reuse]
    assert run["after"] == 1  # restored after the run
