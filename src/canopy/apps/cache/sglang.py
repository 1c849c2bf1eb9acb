"""Renamed :mod:`canopy.apps.cache.sglang_replay` (beside the integration of the same name,
:mod:`canopy.integrations.sglang`); this path warns and goes in the next release."""

import warnings
from typing import Any

from canopy.apps.cache import sglang_replay as _moved

warnings.warn("canopy.apps.cache.sglang is deprecated; use canopy.apps.cache.sglang_replay",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
