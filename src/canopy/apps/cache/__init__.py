"""Prefix-cache eviction (paper Section 4, "Serving systems"; Appendix E): a radix block cache,
eviction policies swapped by name, trace readers and replay scenarios."""

from canopy._lazy import lazy_exports

_EXPORTS = {
    "LFU": "canopy.apps.cache.policies",
    "LRU": "canopy.apps.cache.policies",
    "POLICIES": "canopy.apps.cache.policies",
    "SIEVE": "canopy.apps.cache.policies",
    "Canopy": "canopy.apps.cache.policies",
    "EvictionPolicy": "canopy.apps.cache.policies",
    "Optimal": "canopy.apps.cache.policies",
    "make_policy": "canopy.apps.cache.policies",
    "OnlinePolicy": "canopy.apps.cache.stream",
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
    "LFU", "LRU", "POLICIES", "SIEVE", "Canopy", "EvictionPolicy", "OnlinePolicy", "Optimal",
    "RadixCache",
    "ReplayResult", "TTFTModel", "Trace", "from_paths", "load_mooncake", "load_prompt_log",
    "make_policy", "recovery_curve", "replay", "resolve", "scenario", "sweep",
]


lazy_exports(__name__, _EXPORTS)
