"""bench/records.py: a benchmark's printed tables become JSON records the site renders.

A tiny script formats a table with ``common.format_table`` and exits; the record file it
leaves must carry the table and its provenance, and the docs hook must render it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys
sys.path.insert(0, {bench!r})
from common import format_table
print(format_table(["engine", "atom-steps/s"], [["alchemi_lit", 1.5e6], ["ase", 2.0e4]],
                   title="a tiny table"))
"""


def test_printed_tables_are_written_as_records_with_provenance(tmp_path):
    script = tmp_path / "bench_tiny.py"
    script.write_text(SCRIPT.format(bench=str(ROOT / "bench")))
    env = {**os.environ, "ALCHEMI_BENCH_RESULTS": str(tmp_path / "records"),
           "ALCHEMI_BENCH_MACHINE": "test machine"}
    proc = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (path,) = (tmp_path / "records").glob("bench_tiny-*.json")
    (record,) = json.loads(path.read_text())
    assert record["title"] == "a tiny table"
    assert record["headers"] == ["engine", "atom-steps/s"]
    assert record["rows"] == [["alchemi_lit", "1500000.0"], ["ase", "20000.0"]]
    assert record["command"].endswith("bench_tiny.py --quick")
    assert record["machine"] == "test machine"
    assert record["processor"] and record["torch"] and len(record["date"]) == 10

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import benchmarks
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    table = benchmarks.render(record)
    assert "| alchemi_lit | 1500000.0 |" in table and "test machine" in table


def test_records_off_writes_nothing(tmp_path):
    script = tmp_path / "bench_tiny.py"
    script.write_text(SCRIPT.format(bench=str(ROOT / "bench")))
    env = {**os.environ, "ALCHEMI_BENCH_RESULTS": "off"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "records:" not in proc.stderr
