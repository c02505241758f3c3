"""mkdocs hook: the API reference pages, one per package, made from every ``__all__``.

The pages are generated at build time (never hand-written), so a name added to a
module's ``__all__`` appears in the reference with the next build; tests/test_docs.py
checks that every such name was rendered.  The modules are found without importing
the package (``ast``), as griffe reads them.
"""

from __future__ import annotations

import ast
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "alchemi_lit"
#: modules left out: private (a leading underscore) and the pre-release import shims
SKIP_PREFIX = "_"


def public_modules(package: Path = PACKAGE) -> dict[str, list[str]]:
    """Dotted module name -> its ``__all__``, for every module of the package defining one."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith(SKIP_PREFIX) for p in parts):
            continue
        names = module_all(path)
        if names is not None:
            found[".".join(parts)] = names
    return found


def module_all(path: Path) -> list[str] | None:
    """The literal ``__all__`` of a module file, or None where it has none."""
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "__all__":
            return list(ast.literal_eval(node.value))
    return None


def page_of(module: str) -> str:
    """The reference page of a module: one per first-level package."""
    parts = module.split(".")
    return "reference/" + (parts[1] if len(parts) > 1 else "alchemi_lit") + ".md"


def pages() -> dict[str, str]:
    """Reference page path -> its markdown (mkdocstrings directives)."""
    grouped: dict[str, list[tuple[str, list[str]]]] = {}
    for module, names in public_modules().items():
        grouped.setdefault(page_of(module), []).append((module, names))
    out = {}
    for page, modules in grouped.items():
        title = Path(page).stem
        lines = [f"# `{title}`" if title == "alchemi_lit" else f"# `alchemi_lit.{title}`", ""]
        lines.append("Generated from the docstrings: every name of each module's `__all__`.\n")
        for module, names in sorted(modules):
            members = "\n".join(f"        - {n}" for n in sorted(names) if n != "__version__")
            lines += [
                f"::: {module}",
                "    options:",
                "      show_root_heading: true",
                # names of __all__ that griffe resolves to submodules (integrators.ops;
                # workflows.eos, whose function shares its module's name) are rendered too
                "      show_submodules: true",
                "      members:",
                members or "        []",
                "",
            ]
        out[page] = "\n".join(lines)
    return out


def on_files(files, config):
    """Add the generated reference pages to the site's files."""
    for path, content in pages().items():
        files.append(File.generated(config, path, content=content))
    return files


def on_config(config):
    """Fill the nav's "Reference" section with the generated pages, in package order
    (before mkdocs checks that every page is in the nav)."""
    children = next((item["Reference"] for item in config["nav"]
                     if isinstance(item, dict) and isinstance(item.get("Reference"), list)), None)
    if children is not None:
        for path in sorted(pages(), key=lambda p: (p != "reference/alchemi_lit.md", p)):
            title = Path(path).stem
            children.append({title if title == "alchemi_lit" else f"alchemi_lit.{title}": path})
    return config
