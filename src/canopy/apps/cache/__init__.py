"""Prefix-cache eviction (paper Section 4, "Serving systems"; Appendix E): a radix block cache,
eviction policies swapped by name, trace readers and replay scenarios."""

import importlib
from typing import Any

_EXPORTS = {
    "LFU": "canopy.apps.cache.policies",
    "LRU": "canopy.apps.cache.policies",
    "POLICIES": "canopy.apps.cache.policies",
    "SIEVE": "canopy.apps.cache.policies",
    "Canopy": "canopy.apps.cache.policies",
    "EvictionPolicy": "canopy.apps.cache.policies",
    "Optimal": "canopy.apps.cache.policies",
    "make_policy": "canopy.apps.cache.policies",
    "RadixCache": "canopy.apps.cache.radix",
    "ReplayResult": "canopy.apps.cache.replay",
    "recovery_curve": "canopy.apps.cache.replay",
    "replay": "canopy.apps.cache.replay",
    "scenario": "canopy.apps.cache.replay",
    "sweep": "canopy.apps.cache.replay",
    "Trace": "canopy.apps.cache.traces",
    "from_paths": "canopy.apps.cache.traces",
    "load_mooncake": "canopy.apps.cache.traces",
    "load_prompt_log": "canopy.apps.cache.traces",
    "resolve": "canopy.apps.cache.traces",
    "TTFTModel": "canopy.apps.cache.ttft",
}

__all__ = [
    "LFU", "LRU", "POLICIES", "SIEVE", "Canopy", "EvictionPolicy", "Optimal", "RadixCache",
    "ReplayResult", "TTFTModel", "Trace", "from_paths", "load_mooncake", "load_prompt_log",
    "make_policy", "recovery_curve", "replay", "resolve", "scenario", "sweep",
]


def __getattr__(name: str) -> Any:
    """Import on first use (PEP 562), so ``canopy --help`` loads no numba or scipy."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'canopy.apps.cache' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
