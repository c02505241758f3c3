"""Config files and ``--key value`` overrides -> one plain dict, parsed by jsonargparse.

The YAML files and the overrides are merged here, not by jsonargparse, because
jsonargparse 4.53 cannot parse what alchemi-lit's keys address (measured):

* a list item by index, ``--simulator.stages.1.init_args.temperature 500`` (an error:
  the key is not an option), and ``--simulator.stages.init_args.x`` on the
  ``Integrator | Sequence[...]`` union that ``stages`` is (an ``AttributeError``);
* registered names that are not class names: presets (``--simulator.stages+=fire-ase``)
  and aliases (``class_path: lj-argon``); see :mod:`.names`.

So the overrides are applied to the merged dict in order, with jsonargparse's meaning
(``+=`` appends, a key without an index changes the last item, a new ``class_path``
keeps the init_args the new class accepts), and jsonargparse then parses the result
(types, defaults, ``--print_config``, help) in :func:`parse_config`.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path
from typing import Any

from .errors import CLIError, one_line
from .names import COMPONENT_META, import_class, init_params, lookup
from .sections import Sections

BUILTIN_PREFIX = "builtin:"


# ---------------------------------------------------------------------- YAML files
def load_yaml(path: str, sections: Sections) -> dict[str, Any]:
    """A ``--config`` file as a dict; its structure path is made relative to it."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise CLIError(
            "--config",
            f"file {path!r} does not exist" if not p.exists() else f"{path!r} is not a file",
        )
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise CLIError(
            "--config", f"{path}: invalid YAML{where}: {one_line(str(problem))}"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CLIError(
            "--config", f"{path}: expected a mapping with sections {', '.join(sections.names)}"
        )
    for key in data:
        if key not in sections.names:
            close = difflib.get_close_matches(str(key), sections.names, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise CLIError(
                str(key),
                f"unknown section in --config {path}.{hint} Sections: {', '.join(sections.names)}",
            )
    structures = (
        (data.get("data") or {}).get("structures") if isinstance(data.get("data"), dict) else None
    )
    if isinstance(structures, str) and structures and not structures.startswith(BUILTIN_PREFIX):
        data["data"]["structures"] = _resolve_relative(structures, p.parent)
    return data


def _load_yaml_section(path: str, section: str) -> dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise CLIError(
            section, f"expected a mapping or a YAML file holding one; {path!r} is neither"
        )
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise CLIError(section, f"{path}: invalid YAML: {one_line(str(exc))}") from None
    if not isinstance(data, dict):
        raise CLIError(section, f"{path}: expected a mapping")
    structures = data.get("structures") if section == "data" else None
    if isinstance(structures, str) and structures and not structures.startswith(BUILTIN_PREFIX):
        data["structures"] = _resolve_relative(structures, p.parent)
    return data


def _resolve_relative(path: str, base: Path) -> str:
    """A path written in a config file: next to the config if it exists there, else as given."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return str(p)
    candidate = base / p
    if candidate.exists():
        try:
            return os.path.relpath(candidate)
        except ValueError:  # other drive (Windows)
            return str(candidate.resolve())
    return path


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge, everything else (lists included) is replaced."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


# ---------------------------------------------------------------------- overrides
def merged_config(
    configs: list[str], overrides: list[tuple[str, str, bool]], sections: Sections
) -> dict[str, Any]:
    """The ``--config`` files merged in order, then each ``(key, raw value, append)``
    override applied in order."""
    conf: dict[str, Any] = {}
    for path in configs:
        conf = merge(conf, load_yaml(path, sections))
    for key, raw, append in overrides:
        apply_override(conf, key, raw, append, sections)
    return conf


def parse_value(raw: str) -> Any:
    """A command-line value as YAML (numbers, booleans, null, lists, dicts); else the string."""
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def is_index(part: str) -> bool:
    return bool(re.fullmatch(r"-?\d+", part))


def apply_override(
    conf: dict[str, Any], key: str, raw: str, append: bool, sections: Sections
) -> None:
    """Set ``key`` (dotted, list items by index) in ``conf``, like jsonargparse would."""
    parts = [p for p in key.split(".") if p]
    if not parts or parts[0] not in sections.names:
        close = difflib.get_close_matches(parts[0] if parts else key, sections.names, n=1)
        hint = f" Did you mean --{close[0]}...?" if close else ""
        raise CLIError(key, f"unknown option.{hint} Options start with {sections.options()}")
    value = parse_value(raw)
    if len(parts) == 1 and parts[0] in sections.groups and isinstance(value, str) and not append:
        # --simulator sim.yaml: a file holding just that section (as in jsonargparse)
        section = _load_yaml_section(value, parts[0])
        conf[parts[0]] = merge(conf.get(parts[0]) or {}, section)
        return
    node: Any = conf
    walked: list[str] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        here = ".".join([*walked, part])
        if isinstance(node, list):
            if is_index(part):
                idx = int(part)
                if not -len(node) <= idx < len(node):
                    raise CLIError(
                        here, f"index {idx} out of range: the list has {len(node)} item(s)"
                    )
                if last:
                    node[idx] = _appended(node[idx], value) if append else value
                    return
                if node[idx] is None or isinstance(node[idx], str):
                    node[idx] = {"class_path": node[idx]} if isinstance(node[idx], str) else {}
                node = node[idx]
                walked.append(part)
                continue
            if not node:
                raise CLIError(here, "the list is empty; add an item first (--key+=NAME)")
            if isinstance(node[-1], str):  # a bare name: make it a component
                node[-1] = {"class_path": node[-1]}
            node = node[-1]  # jsonargparse: --stages.init_args.x changes the last item
        if not isinstance(node, dict):
            raise CLIError(
                ".".join(walked), f"is {type(node).__name__} {node!r}, cannot set {part!r} in it"
            )
        if "class_path" in node and part not in COMPONENT_META:
            init = node.get("init_args")
            if not isinstance(init, dict):
                init = node["init_args"] = {}
            node = init
        if last:
            if part == "class_path" and "class_path" in node and not append:
                _change_class(node, value, here)
            elif append:
                node[part] = _appended(node.get(part), value)
            else:
                node[part] = value
            return
        child = node.get(part)
        if child is None or (isinstance(child, str) and not is_index(parts[i + 1])):
            child = (
                {"class_path": child}
                if isinstance(child, str)
                else ([] if is_index(parts[i + 1]) else {})
            )
            node[part] = child
        node = child
        walked.append(part)


def _appended(current: Any, value: Any) -> list[Any]:
    if current is None:
        return [value]
    if isinstance(current, list):
        return [*current, value]
    return [current, value]  # a single component becomes a list of two


def _change_class(node: dict[str, Any], name: Any, key: str) -> None:
    """``--x.class_path NEW``: keep the init_args the new class accepts (jsonargparse does too)."""
    node["class_path"] = name
    init = node.get("init_args")
    if not isinstance(init, dict) or not isinstance(name, str):
        return
    path, preset = lookup(name, key, None)
    cls = import_class(path, key)
    params = init_params(cls)
    if params is not None:
        node["init_args"] = {k: v for k, v in init.items() if k in params}
    node["class_path"] = path
    node["init_args"] = {**preset, **node.get("init_args", {})}


# ---------------------------------------------------------------------- jsonargparse
def parse_config(
    parser: Any,
    conf: dict[str, Any],
    passthrough: list[str],
    owners: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """jsonargparse's parse of the merged config (types, defaults; ``--print_config`` and
    help exit here) -> the resolved config as a plain dict (its dump, re-runnable).

    On a parse error the key it is about is found by parsing again with one key left out
    at a time (its default then applies): the first whose absence removes the error.
    ``owners``: what each section's signature is read from, for the expected type
    (default: the Simulator, :class:`DataConfig`, :class:`OutputConfig`)."""
    import yaml
    from jsonargparse import ArgumentError

    try:
        cfg = _parse(parser, conf, passthrough)
    except ArgumentError as exc:
        raise _explained(parser, conf, passthrough, owners, exc) from None
    resolved = yaml.safe_load(parser.dump(cfg)) or {}
    resolved.pop("config", None)
    return resolved


def _parse(parser: Any, conf: dict[str, Any], passthrough: list[str]) -> Any:
    return parser.parse_args([*(["--config", _config_text(conf)] if conf else []), *passthrough])


def _explained(
    parser: Any,
    conf: dict[str, Any],
    passthrough: list[str],
    owners: dict[str, Any] | None,
    exc: Exception,
) -> CLIError:
    from jsonargparse import ArgumentError

    from .errors import rejected, unexplained

    for key, value in _leaves(conf, ""):
        try:
            _parse(parser, _without(conf, key.split(".")), passthrough)
        except ArgumentError:
            continue
        return rejected(key, value, _annotation(key, owners))
    return unexplained(exc, "")


def _leaves(node: dict[str, Any], prefix: str) -> list[tuple[str, Any]]:
    """Dotted keys of the config's values; a plugin entry or a list is one value."""
    out: list[tuple[str, Any]] = []
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v and "class_path" not in v:
            out += _leaves(v, key)
        else:
            out.append((key, v))
    return out


def _without(node: dict[str, Any], parts: list[str]) -> dict[str, Any]:
    head, *rest = parts
    return {
        k: (_without(v, rest) if rest and k == head else v)
        for k, v in node.items()
        if rest or k != head
    }


def _annotation(key: str, owners: dict[str, Any] | None) -> Any:
    """The annotation our signature gives ``key`` (``simulator.precision``), if known."""
    import inspect

    from ..simulator import Simulator
    from .errors import annotation_of
    from .sections import DataConfig, OutputConfig

    owners = {"simulator": Simulator, "data": DataConfig, "output": OutputConfig, **(owners or {})}
    section, _, name = key.partition(".")
    owner = owners.get(section)
    if owner is None or not name or "." in name:
        return inspect.Parameter.empty
    return annotation_of(owner, name)


def _config_text(conf: dict[str, Any]) -> str:
    """The merged config as JSON that jsonargparse's YAML loader reads back unchanged: YAML
    rejects JSON's surrogate-pair escapes of characters beyond U+FFFF (emoji, rare CJK in a
    path), so those stay literal; characters YAML does not print, or reads as line breaks
    (U+0085, U+2028, U+2029), and the byte order mark stay escaped."""
    text = json.dumps(conf, default=str, ensure_ascii=False)
    return re.sub(
        "[^\t\n\r\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]",
        lambda m: f"\\u{ord(m.group()):04x}",
        text,
    )
