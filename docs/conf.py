"""Sphinx configuration: the docs pages (Markdown, through myst-parser) and an API reference
generated from the docstrings of every public module of the package.

Build it strictly (any broken link or reference fails): ``sphinx-build -W --keep-going -n
docs docs/_build/html``."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import types
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "src"))

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM: no fetch at import

from sphinx.ext.napoleon.docstring import GoogleDocstring  # noqa: E402

import canopy  # noqa: E402

project = "Canopy"
author = "the Canopy authors"
copyright = "the Canopy authors, Apache-2.0"
release = canopy.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
nitpicky = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# A package's page documents what it defines; what it re-exports is documented where defined.
autodoc_default_options = {"members": True, "show-inheritance": True,
                           "ignore-module-all": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Types outside the package: no intersphinx (the build reads nothing from the network).
nitpick_ignore_regex = [
    (r"py:(class|obj|exc|data|func|meth|attr)",
     r"(np|numpy|numba|scipy|httpx|fastapi|starlette|typer|rich|redis|ray|litellm|vllm|"
     r"sglang|llama_cpp|llmlingua|pandas|matplotlib|sqlite3|pathlib|os|io|collections|"
     r"typing|asyncio|threading|subprocess|concurrent|json|enum|types|datetime|logging|"
     r"contextlib|dataclasses|http|socket|numpy\.typing|npt|_io|Path|NDArray|abc|_thread|"
     r"re|fractions|statistics|uvicorn|click|pydantic|openai|queue|random|hashlib|"
     r"BackgroundTask)(\..*)?"),
]
html_theme = "alabaster"

# The package's attribute and constant docstrings are prose ("The node table: ..."), never
# napoleon's inline "type: description" form, which would read their first words as a type.
GoogleDocstring._parse_attribute_docstring = lambda self: self._consume_to_end()

# The API reference: one page per public module (no part of its dotted name starts with an
# underscore), written into api/ at every build, so a module added to the package is listed
# without editing the docs. The command-line and study modules are documented by the pages.
SKIP = ("canopy.__main__", "canopy.experiments.studies.", "canopy.commands", "canopy.cli")


def public_modules() -> list[str]:
    names = ["canopy"]
    for info in pkgutil.walk_packages(canopy.__path__, "canopy."):
        if any(part.startswith("_") for part in info.name.split(".")) or \
                info.name.startswith(SKIP) or info.name.endswith(".cli"):
            continue
        names.append(info.name)
    return sorted(names)


def write_api_pages() -> None:
    folder = DOCS / "api"
    folder.mkdir(exist_ok=True)
    for stale in folder.glob("*.rst"):
        stale.unlink()
    modules = public_modules()
    for name in modules:
        importlib.import_module(name)  # an import error fails the build here, named
        title = f"``{name}``"
        (folder / f"{name}.rst").write_text(
            f"{title}\n{'=' * len(title)}\n\n.. automodule:: {name}\n")
    toc = "\n".join(f"   {name}" for name in modules)
    (folder / "index.rst").write_text(
        "API reference\n=============\n\nGenerated from the docstrings; one page a module.\n\n"
        f".. toctree::\n   :maxdepth: 1\n\n{toc}\n")


def public_bases(app, name, obj, options, bases: list) -> None:
    """Show a class's public bases only: a private base (``_LeafPhased``) has no page."""
    bases[:] = [base for base in bases
                if not any(part.startswith("_") and part != "__main__" for part in
                           f"{getattr(base, '__module__', '')}.{base.__qualname__}".split(".")
                           if part)] if all(isinstance(b, type) for b in bases) else bases


def _find(path: str, module: str | None, owner: str | None) -> object | None:
    """The object ``path`` names: absolute (``canopy.policies.TopKBeam``), or from the
    namespace of the referring module (and class), as the docstring's author read it."""
    starts = [""] + ([f"{module}."] if module else []) + \
        ([f"{module}.{owner}."] if module and owner else [])
    for start in reversed(starts):
        parts = (start + path).split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for part in parts[cut:]:
                    obj = getattr(obj, part)
            except AttributeError:
                break
            return obj
    return None


def _canonical(path: str, module: str | None, owner: str | None) -> str | None:
    """Where the object ``path`` names is defined (and documented): its module and
    qualified name, following re-exports and imports."""
    head, _, tail = path.rpartition(".")
    obj = _find(path, module, owner)
    where = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(obj, (type, types.FunctionType)) and all(where):
        return f"{where[0]}.{where[1]}"
    holder = _find(head, module, owner) if head else None
    if holder is not None and (canon := _canonical(head, module, owner)):
        return f"{canon}.{tail}"  # a method, attribute or constant of a resolved holder
    return None


def follow_imports(app, env, node, contnode):
    """Resolve a reference to a name re-exported or imported elsewhere (``canopy.Tree``,
    ``Ledger`` in a module that imports it) to the page of the module that defines it."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    canon = _canonical(target, node.get("py:module"), node.get("py:class"))
    if canon is None or canon == target:
        return None
    domain = env.get_domain("py")
    if canon not in domain.objects:
        return None
    node["reftarget"] = canon
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], canon, node,
                               contnode)


def setup(app) -> None:
    app.connect("autodoc-process-bases", public_bases)
    app.connect("missing-reference", follow_imports)


write_api_pages()
