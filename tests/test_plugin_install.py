"""The toy plugin used for entry-point discovery is this checkout's, and only for the session.

``tests/conftest.py`` pip-installs ``tests/plugin_pkg`` (the distribution
``alchemi-lit-toy``) with ``--target`` into a temporary directory put on ``sys.path``
and ``PYTHONPATH``, and removes it when the session ends; ``test_registry.py`` uses it
in process.  Here: the installed copy is the one from this checkout, and a fresh
interpreter finds it through importlib.metadata entry points alone, as a user's plugin
would be found.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from alchemi_lit.core import registry
from conftest import TOY_DIST, TOY_SRC, check_toy_plugin_is_ours


def test_installed_copy_is_this_checkouts(toy_plugin_site: Path) -> None:
    check_toy_plugin_is_ours(toy_plugin_site)
    dist = metadata.distribution(TOY_DIST)
    assert (toy_plugin_site / f"alchemi_lit_toy-{dist.version}.dist-info").is_dir()
    eps = [ep for ep in dist.entry_points if ep.group == registry.ENTRY_POINT_GROUP]
    assert [(ep.name, ep.value) for ep in eps] == [("toy", "alchemi_lit_toy:register_plugins")]
    # pip built from a copy: the source tree in tests/ is left clean
    assert not list(TOY_SRC.glob("*.egg-info")) and not (TOY_SRC / "build").exists()


def test_fresh_interpreter_discovers_the_entry_point(toy_plugin_site: Path) -> None:
    code = """
import json, sys
from alchemi_lit.core import registry
e = registry.get("integrator", "ToyDamped")
m = registry.get("model", "ToyHarmonic")
print(json.dumps([e.source, m.source, sys.modules[e.cls.__module__].__file__]))
"""
    # PYTHONPATH (set by conftest) is the only way the subprocess can see the plugin
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    source, model_source, module_file = json.loads(proc.stdout.splitlines()[-1])
    assert source == model_source == TOY_DIST
    assert Path(module_file).resolve().is_relative_to(toy_plugin_site.resolve())
