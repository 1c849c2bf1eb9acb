"""Moved to :mod:`canopy.prefix.traces` (the prefix-cache core, which every host and application
shares); this module keeps the old import path working."""

from typing import Any

from canopy.prefix import traces as _moved


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
