"""Old module paths keep working for one release (issue #28, part 3).

The root modules moved into layer packages (``core/``, ``io/``, ``report/`` ...).  Code
written against the old paths -- a user's script, a plugin -- must still import, get the
very module object at the new path (so a setting changed through either name is one
setting), and be told where the module went.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from alchemi_lit._moved import MOVED

CHECK = textwrap.dedent(
    """
    import importlib, sys, warnings
    import alchemi_lit
    from alchemi_lit._moved import MOVED
    for old, new in MOVED.items():
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
        assert module.__name__ == new == module.__spec__.name, (old, module.__spec__)
        assert sys.modules[old] is module
        words = [str(w.message) for w in seen if w.category is DeprecationWarning]
        assert any(new in w and old in w for w in words), (old, words)
    # the same module: a switch set through the old name is the new name's switch
    import alchemi_lit.tensor_ops as old_ops
    from alchemi_lit.core import tensor_ops
    old_ops.CPU_READS_FREE = False
    assert tensor_ops.CPU_READS_FREE is False
    from alchemi_lit.state import Batch
    from alchemi_lit.core.state import Batch as NewBatch
    assert Batch is NewBatch
    assert alchemi_lit.stages is importlib.import_module("alchemi_lit.integrators.stages")
    print("ok", len(MOVED))
    """
)


def test_every_old_path_imports_the_new_module_and_warns():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", str(len(MOVED))]


def test_the_root_holds_only_the_public_entry_points():
    """The layers show as folders: only the package's entry points stay at the root."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "alchemi_lit"
    modules = sorted(p.name for p in root.glob("*.py"))
    assert modules == ["__init__.py", "_moved.py", "plugins_builtin.py", "simulator.py"]
    for old in MOVED:
        assert not (root.parent / (old.replace(".", "/") + ".py")).exists(), old
