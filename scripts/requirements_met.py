"""Exit 0 when every given requirement is met by what is installed, 1 otherwise.

Why: on a machine that already has every dependency (a CI machine, a second clone),
pip still resolves them all again in each install script: most of a fresh clone's
`make install-test` (38 s of it here).  The install scripts ask this first; when it
says yes they only (re)install our editable packages with ``--no-deps``, else pip runs
its full resolution as before.  So it must never say yes wrongly: each requirement is
checked with its version range, extras and markers, and so are the requirements of
what it finds, down to the bottom (what ``pip install`` itself would demand).

Usage::

    python scripts/requirements_met.py 'numpy>=1.24' pyproject.toml[test] ...
    python scripts/requirements_met.py --alone 'mace-torch==0.3.16' ...

An argument ending in ``pyproject.toml`` (optionally ``[extra,...]``) stands for that
project's dependencies (and those extras'); ``--alone`` checks the requirements after
it without their own dependencies (packages the scripts install with ``--no-deps``).
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version


def project_requirements(spec: str) -> list[str]:
    """``path/pyproject.toml[extra,...]``: the project's dependencies and those extras'."""
    import tomllib

    path, _, extras = spec.partition("[")
    project = tomllib.loads(Path(path).read_text())["project"]
    out = list(project.get("dependencies", []))
    for extra in filter(None, extras.rstrip("]").split(",")):
        out += project.get("optional-dependencies", {})[extra.strip()]
    return out


def met(requirement: str, deep: bool, seen: set[tuple[str, frozenset[str]]]) -> bool:
    """Whether ``requirement`` (and, with ``deep``, all it depends on) is installed."""
    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return False
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        return True  # not for this interpreter or platform
    try:
        dist = metadata.distribution(req.name)
        version = Version(dist.version)
    except (metadata.PackageNotFoundError, InvalidVersion):
        return False
    if not req.specifier.contains(version, prereleases=True):
        return False
    key = (canonicalize_name(req.name), frozenset(req.extras))
    if not deep or key in seen:  # (its own requirements: checked once)
        return True
    seen.add(key)
    for dependency in dist.requires or []:
        try:
            needed = Requirement(dependency)
        except InvalidRequirement:
            return False
        wanted_by = ["", *sorted(req.extras)]  # its plain dependencies and our extras'
        if needed.marker is not None and not any(
            needed.marker.evaluate({"extra": extra}) for extra in wanted_by
        ):
            continue
        needed.marker = None
        if not met(str(needed), True, seen):
            return False
    return True


def main(args: list[str]) -> int:
    seen: set[tuple[str, frozenset[str]]] = set()
    deep = True
    for arg in args:
        if arg == "--alone":
            deep = False
            continue
        try:
            requirements = (
                project_requirements(arg) if arg.split("[")[0].endswith("pyproject.toml") else [arg]
            )
        except (OSError, KeyError, ValueError, ImportError):
            return 1
        if not all(met(r, deep, seen) for r in requirements):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
