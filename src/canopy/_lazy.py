"""Lazy package exports (PEP 562): a package names what it exports and the module of each,
and imports that module on first use, so ``canopy --help`` loads no numba or scipy. Names
that moved stay importable from their old module for one release, with a warning
(:func:`deprecated_aliases`)."""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["deprecated_aliases", "lazy_exports"]


class _Package(types.ModuleType):
    """A package whose exports survive the import of a submodule of the same name (``replay``
    the function and ``replay`` the module): the import system's ``setattr`` of the submodule
    is ignored for such a name, as it was when the package imported it eagerly."""

    _exports: Mapping[str, str]

    def __setattr__(self, name: str, value: Any) -> None:
        exports = self.__dict__.get("_exports", {})
        if (isinstance(value, types.ModuleType) and name in exports
                and value.__name__ == f"{self.__name__}.{name}"):
            return
        super().__setattr__(name, value)


def lazy_exports(package: str, exports: Mapping[str, str]) -> None:
    """Make ``package`` import ``exports[name]`` (a module path) when ``name`` is first read."""
    module = sys.modules[package]

    def __getattr__(name: str) -> Any:
        source = exports.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        types.ModuleType.__setattr__(module, name, value)
        return value

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    module._exports = dict(exports)  # type: ignore[attr-defined]
    module.__class__ = _Package


def deprecated_aliases(module: str, moved: Mapping[str, str]) -> None:
    """Keep each name of ``moved`` importable from ``module`` for one more release: reading
    it there warns (``DeprecationWarning``, naming the new place) and returns the object
    from its new place, ``"package.module"`` (same name) or ``"package.module:name"``."""
    target = sys.modules[module]
    before = target.__dict__.get("__getattr__")

    def __getattr__(name: str) -> Any:
        source = moved.get(name)
        if source is None:
            if before is not None:
                return before(name)
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        place, _, new_name = source.partition(":")
        warnings.warn(f"{module}.{name} is deprecated and goes in the next release: use "
                      f"{place}.{new_name or name}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(place), new_name or name)

    target.__getattr__ = __getattr__  # type: ignore[method-assign]
