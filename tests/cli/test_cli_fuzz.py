"""Property test: ``alchemi-lit validate`` never crashes on a malformed config.

Hypothesis mutates small valid configs -- deletes keys, replaces values with random
ones (None, booleans, negative / huge numbers, NaN, strings, nested lists and dicts),
misspells plugin names, adds unknown keys -- or writes random YAML documents or plain
random text, and runs ``main(["validate", "--config", path])`` in-process.  Whatever the
input, the validator must answer with status 0 (valid) or 2 (one ``error:`` line naming the
problem), never with an internal error (status 1), an exception escaping ``main`` or a
traceback.  Examples that once crashed are kept as regression rows in
``tests/test_bad_inputs.py``.

The structures are one 4-atom argon crystal, so one example takes milliseconds.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alchemi_lit.cli import main

TINY_DATA = {"structures": "builtin:argon", "builtin_args": {"n_systems": 1, "repeat": 1}}

#: Valid tiny configs the mutations start from (each validates with status 0).
SEEDS: list[dict[str, Any]] = [
    {  # relax
        "simulator": {
            "model": {"class_path": "lj-argon"},
            "stages": [{"class_path": "FIRE", "init_args": {"fmax": 0.05, "max_steps": 5}}],
            "accelerator": "cpu",
        },
        "data": TINY_DATA,
    },
    {  # relax + MD with callbacks, a sink and an output section
        "simulator": {
            "model": {"class_path": "LennardJones", "init_args": {"cutoff": 8.0}},
            "stages": [
                {"class_path": "FIRE2", "init_args": {"fmax": 0.1, "max_steps": 3}},
                {
                    "class_path": "Langevin",
                    "init_args": {"dt": 2.0, "temperature": 60.0, "friction": 0.01, "steps": 3},
                },
            ],
            "callbacks": [
                {"class_path": "Logger", "init_args": {"every": 10}},
                {"class_path": "TrajectoryWriter", "init_args": {"path": "t.zarr", "every": 2}},
            ],
            "sinks": [{"class_path": "ZarrSink", "init_args": {"store": "r.zarr", "mode": "w"}}],
            "precision": "64",
            "seed": 1,
            "sync_every": 2,
            "accelerator": "cpu",
        },
        "data": {**TINY_DATA, "sampler": {"max_atoms": 64, "max_systems": 4}},
        "output": {"dir": "out", "name": "x"},
    },
    {  # a two-rank pipeline (validate builds it, launches nothing)
        "simulator": {
            "model": "lj-argon",
            "stages": [
                [{"class_path": "FIRE", "init_args": {"max_steps": 3}}],
                [{"class_path": "VelocityVerlet", "init_args": {"dt": 1.0, "steps": 3}}],
            ],
            "devices": 2,
            "buffer": {"num_systems": 4, "num_atoms": 64},
            "comm_mode": "async_recv",
            "accelerator": "cpu",
        },
        "data": TINY_DATA,
    },
]

NAMES = [
    "FIRE", "FIRE2", "fire-ase", "Langevin", "NoseHooverChain", "VelocityVerlet", "Bussi",
    "lj-argon", "LennardJones", "EMT", "Morse", "Logger", "ThermoMonitor", "Checkpoint",
    "ZarrSink", "HostMemory", "builtin:argon", "builtin:mixed_argon", "auto", "cpu", "cuda",
    "single", "pipeline", "replicas", "sync", "fully_async", "64", "32", "w", "w-", "a",
    "alchemi_lit.models.pair.LennardJones", "os.path.join", "", ".", "..", "builtin:",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=3),
    st.sampled_from([-(10**30), 10**30, 2**63, -1, 0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(NAMES),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=6), st.sampled_from(NAMES)), inner, max_size=3),
    ),
    max_leaves=6,
)
keys = st.one_of(
    st.sampled_from(["class_path", "init_args", "dict_kwargs", "max_atoms", "num_atoms", "steps"]),
    st.text(min_size=1, max_size=8),
    st.integers(min_value=-2, max_value=2),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path (tuple of keys / list indices) inside a config, the root excluded."""
    if isinstance(node, dict):
        items: Any = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return
    for k, v in items:
        yield (*prefix, k)
        yield from _paths(v, (*prefix, k))


def _parent(conf: Any, path: tuple[Any, ...]) -> Any:
    node = conf
    for k in path[:-1]:
        node = node[k]
    return node


@st.composite
def mutated_config(draw: st.DrawFn) -> Any:
    """A seed config after 1-3 random mutations (or, sometimes, any YAML document)."""
    if draw(st.integers(0, 9)) == 0:  # top level: a scalar, a list, a random mapping
        return draw(values)
    conf: Any = copy.deepcopy(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(conf))
        op = draw(st.sampled_from(["delete", "replace", "rename", "add"]))
        if op == "add" or not paths:
            targets = [p for p in [(), *paths] if isinstance(_get(conf, p), dict)]
            if targets:
                node = _get(conf, draw(st.sampled_from(targets)))
                node[draw(keys)] = draw(values)
            continue
        path = draw(st.sampled_from(paths))
        parent = _parent(conf, path)
        if op == "delete":
            del parent[path[-1]]
        elif op == "replace":
            parent[path[-1]] = draw(values)
        else:  # rename a plugin (near miss or random) or a key
            if path[-1] == "class_path" and isinstance(parent[path[-1]], str):
                name = parent[path[-1]]
                cut = draw(st.integers(0, max(len(name) - 1, 0)))
                parent[path[-1]] = draw(
                    st.one_of(
                        st.just(name[:cut] + name[cut + 1 :]),  # a dropped letter
                        st.just(name + draw(st.text(min_size=1, max_size=2))),
                        st.sampled_from(NAMES),
                    )
                )
            elif isinstance(parent, dict):
                parent[draw(keys)] = parent.pop(path[-1])
    return _tame(conf)


def _get(conf: Any, path: tuple[Any, ...]) -> Any:
    node = conf
    for k in path:
        node = node[k]
    return node


def _tame(conf: Any) -> Any:
    """Keep a mutated config *cheap* to validate, not valid: the built-in sets build
    their structures eagerly, so sizes there stay tiny, and a plan is replicated once
    per device, so device counts stay small."""
    if not isinstance(conf, dict):
        return conf
    data = conf.get("data")
    args = data.get("builtin_args") if isinstance(data, dict) else None
    if isinstance(args, dict):
        for k, v in list(args.items()):
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 3:
                args[k] = 2
    sim = conf.get("simulator")
    if isinstance(sim, dict):
        devices = sim.get("devices")
        if isinstance(devices, int) and not isinstance(devices, bool) and abs(devices) > 8:
            sim["devices"] = 4
    return conf


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A scratch working directory: relative paths in a config resolve in there."""
    path = tmp_path_factory.mktemp("fuzz")
    old = os.getcwd()
    os.chdir(path)
    try:
        yield path
    finally:
        os.chdir(old)


class RawYAML(str):
    """File content written as is (random text: YAML syntax errors, odd scalars)."""


raw_yaml = st.one_of(
    st.text(max_size=40),
    st.lists(
        st.sampled_from(["simulator:", "data:", "  model:", "- ", "{", "[", ": ", "\t", "\n"])
    ).map("".join),
).map(RawYAML)


def _validate(conf: Any, folder: Path) -> tuple[int, str]:
    path = folder / "config.yaml"
    if isinstance(conf, RawYAML):
        path.write_text(str(conf))
    else:
        try:
            path.write_text(yaml.safe_dump(conf, allow_unicode=True))
        except yaml.YAMLError:  # not representable (e.g. odd keys): the repr as YAML text
            path.write_text(repr(conf))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["validate", "--config", str(path)])
    return status, err.getvalue()


def test_seeds_are_valid(workdir: Path) -> None:
    for conf in SEEDS:
        status, err = _validate(conf, workdir)
        assert status == 0, err


CONFIGS = st.one_of(mutated_config(), mutated_config(), mutated_config(), raw_yaml)


def check_validate_answers(folder: Path, conf: Any) -> None:
    status, err = _validate(conf, folder)
    assert status in (0, 2), f"status {status} for\n{conf!r}\n{err}"
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    if status == 2:
        assert len(errors) == 1, err
        assert not errors[0].startswith("error: unexpected"), errors[0]
    else:
        assert not errors, err


QUICK = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@QUICK
@given(conf=CONFIGS)
def test_validate_never_crashes(workdir: Path, conf: Any) -> None:
    check_validate_answers(workdir, conf)


@pytest.mark.slow
@settings(QUICK, max_examples=1000)
@given(conf=CONFIGS)
def test_validate_never_crashes_soak(workdir: Path, conf: Any) -> None:
    check_validate_answers(workdir, conf)
