"""Moved to :mod:`canopy.prefix.kernels` (the prefix-cache core, which every host and application
shares); this module keeps the old import path working."""

from typing import Any

from canopy.prefix import kernels as _moved


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
