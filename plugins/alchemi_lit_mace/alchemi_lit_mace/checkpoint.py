"""Loading and saving MACE models without unpickling code.

Why a format of our own: MACE's usual files (``*.model`` from ``mace_run_train``, the
foundation-model downloads) are *whole pickled modules*.  Unpickling one rebuilds
e3nn's code-generated modules from code stored in the file, i.e. it runs whatever the
file says; no allowlist can make that safe, so such files cannot be read with
``torch.load(weights_only=True)``.  A MACE model is, however, fully described by its
constructor arguments (which mace itself extracts with ``extract_config_mace_model``)
plus its ``state_dict``.  :func:`save_checkpoint` writes exactly that, with every
argument reduced to plain values (class and gate names, irreps strings, lists, tensors),
in a file that ``torch.load(weights_only=True)`` reads with no allowlist at all;
:func:`load_model` rebuilds the module from mace's own classes.

Whole pickled modules are still accepted when the caller says they trust the file
(``trust_pickle=True``): that one ``torch.load`` gets ``weights_only=False`` passed
explicitly; no environment variable or global torch setting is touched.  Convert such a
file once and use the safe file from then on::

    python -m alchemi_lit_mace.checkpoint trusted.model safe.pt
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._imports import import_mace

#: ``format`` tag of the files :func:`save_checkpoint` writes.
SAFE_FORMAT = "alchemi_lit_mace/1"

#: Model classes that can be rebuilt from a config (those mace can describe).
_MODEL_CLASSES = ("ScaleShiftMACE",)


class UnsafeCheckpointError(ValueError):
    """A checkpoint can only be read by unpickling code (and the caller did not opt in)."""


def _encode(value: Any, modules: Any) -> Any:
    """A constructor argument as plain, ``weights_only``-loadable data."""
    from e3nn import o3

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, o3.Irreps):
        return {"__irreps__": str(value)}
    if isinstance(value, type):
        if not value.__module__.startswith("mace."):
            raise ValueError(f"cannot save a model built with non-mace class {value!r}")
        return {"__class__": value.__name__}
    if callable(value) and not isinstance(value, torch.nn.Module):
        for name, fn in modules.gate_dict.items():
            if fn is value:
                return {"__gate__": name}
        raise ValueError(f"cannot save unknown activation {value!r}")
    if isinstance(value, np.ndarray):
        return {"__numpy__": torch.from_numpy(np.array(value))}  # keeps 0-d arrays 0-d
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, (list, tuple)):
        return [_encode(v, modules) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v, modules) for k, v in value.items()}
    raise ValueError(f"cannot save MACE config value of type {type(value).__name__}")


def _decode(value: Any, modules: Any) -> Any:
    from e3nn import o3

    if isinstance(value, dict):
        if "__irreps__" in value:
            return o3.Irreps(value["__irreps__"])
        if "__class__" in value:
            name = value["__class__"]
            cls = getattr(modules, name, None)
            if not isinstance(cls, type):
                raise ValueError(f"unknown mace class {name!r} in checkpoint")
            return cls
        if "__gate__" in value:
            return modules.gate_dict[value["__gate__"]]
        if "__numpy__" in value:
            return value["__numpy__"].numpy()
        return {k: _decode(v, modules) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, modules) for v in value]
    return value


def model_config(module: torch.nn.Module) -> dict[str, Any]:
    """Constructor arguments of a MACE ``module``, as plain data."""
    modules = import_mace()
    from mace.tools.scripts_utils import extract_config_mace_model

    name = type(module).__name__
    if name not in _MODEL_CLASSES:
        raise ValueError(f"can only save {', '.join(_MODEL_CLASSES)} models, got {name}")
    config = extract_config_mace_model(module)
    if config.get("cueq_config") is not None or config.get("oeq_config") is not None:
        raise ValueError("convert the model back to plain e3nn before saving it")
    config["atomic_numbers"] = [int(z) for z in module.atomic_numbers]
    return _encode(config, modules)


def save_checkpoint(module: torch.nn.Module, path: str | Path) -> None:
    """Write ``module`` as a file that ``torch.load(weights_only=True)`` can read."""
    payload = {
        "format": SAFE_FORMAT,
        "model_class": type(module).__name__,
        "config": model_config(module),
        "state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()},
    }
    torch.save(payload, str(path))


def build_from_config(model_class: str, config: dict[str, Any]) -> torch.nn.Module:
    """A fresh (randomly initialised) MACE module from a saved config."""
    modules = import_mace()
    if model_class not in _MODEL_CLASSES:
        raise ValueError(f"unsupported MACE model class {model_class!r}")
    return getattr(modules, model_class)(**_decode(config, modules))


def load_model(path: str | Path, trust_pickle: bool = False) -> torch.nn.Module:
    """Load a MACE module from ``path``, safely unless ``trust_pickle`` (see module doc).

    Accepts the files :func:`save_checkpoint` writes and, with ``trust_pickle=True``,
    whole pickled modules (``*.model``).
    """
    import_mace()  # mace classes must be importable (and imported under the guard)
    path = str(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if not trust_pickle:
            raise UnsafeCheckpointError(
                f"{path} is not a plain-data checkpoint: reading it means unpickling code "
                f"stored in the file (MACE *.model files are pickled modules). If you trust "
                f"the file, pass trust_pickle=True, or convert it once with "
                f"`python -m alchemi_lit_mace.checkpoint {path} model_safe.pt` and load "
                f"model_safe.pt instead."
            ) from exc
        obj = torch.load(path, map_location="cpu", weights_only=False)  # caller's explicit opt-in
        if not isinstance(obj, torch.nn.Module):
            raise ValueError(f"{path} holds a {type(obj).__name__}, not a MACE module") from None
        return obj
    if isinstance(obj, dict) and obj.get("format") == SAFE_FORMAT:
        module = build_from_config(obj["model_class"], obj["config"])
        module.load_state_dict(obj["state_dict"], strict=True)
        return module
    raise ValueError(
        f"{path} is neither an alchemi_lit_mace checkpoint nor a pickled MACE module "
        f"(a bare state_dict needs the architecture: MACE(model_path=..., random_init=...))"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Convert a TRUSTED pickled MACE model (*.model) to a weights-only file."
    )
    parser.add_argument("source", help="pickled MACE model you trust (unpickled once, here)")
    parser.add_argument("target", help="output file, loadable with weights_only=True")
    args = parser.parse_args(argv)
    module = load_model(args.source, trust_pickle=True)
    save_checkpoint(module, args.target)
    print(f"wrote {args.target} ({type(module).__name__}, safe to torch.load(weights_only=True))")


if __name__ == "__main__":
    main()
