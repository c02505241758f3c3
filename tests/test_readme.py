"""The README's Python examples run as written (sizes shrunk so the test stays fast)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

# Shrink the examples; everything else runs verbatim.
SHRINK = [
    ("n_systems=32, repeat=3", "n_systems=3, repeat=2"),
    ("max_steps=500", "max_steps=40"),
    ("steps=500", "steps=10"),
    (
        'comm_mode="async_recv",',
        'comm_mode="async_recv", start_method="fork",',
    ),  # not popen under pytest
    ("every_n_steps=1000", "every_n_steps=5"),
]
SKIP = ("my_package", "alchemi_lit_sevenn")  # illustrative plugin code / covered by plugin tests


def python_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    out = []
    for block in blocks:
        if any(s in block for s in SKIP):
            continue
        for old, new in SHRINK:
            block = block.replace(old, new)
        out.append(block)
    return out


@pytest.mark.timeout(300)
def test_readme_python_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks()
    assert len(blocks) >= 6
    namespace: dict = {}
    for k, block in enumerate(blocks):
        if "sampler" in block and "sampler =" not in block and "sampler" not in namespace:
            exec("sampler = SizeAwareSampler(systems, max_atoms=2_000)", namespace)
        try:
            exec(compile(block, f"README block {k}", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the message names the block
            raise AssertionError(f"README python block {k} failed:\n{block}") from exc
    # the custom integrator example relaxes argon
    res = namespace["relax_argon"](namespace["systems"][:1], fmax=0.05)
    assert bool(res.converged.all())
    assert (tmp_path / "results.zarr").exists()
