"""Moved to :mod:`canopy.prefix.evictable` (the prefix-cache core); this module keeps the old
import path working. Its protocol ``PriorityPolicy`` is now
:class:`~canopy.prefix.evictable.EvictionOrder` (``PriorityPolicy`` names the eviction policy
of :mod:`canopy.prefix.policies`); the old name warns and goes in the next release."""

import warnings
from typing import Any

from canopy.prefix import evictable as _moved


def __getattr__(name: str) -> Any:
    if name == "PriorityPolicy":
        warnings.warn("canopy.apps.cache.evictable.PriorityPolicy is deprecated; use "
                      "canopy.prefix.evictable.EvictionOrder", DeprecationWarning, stacklevel=2)
        return _moved.EvictionOrder
    return getattr(_moved, name)
