"""Prefix-cache eviction (paper Section 4, "Serving systems"; Appendix E): the replay scenarios
(:mod:`~canopy.apps.cache.replay`), the live measurements (llama.cpp, ``vllm serve``, SGLang's
radix cache) and the CLI over the core of :mod:`canopy.prefix` (the block tree, its kernels,
the policies, trace readers and TTFT model), whose names this package also exports."""

from canopy._lazy import lazy_exports

_EXPORTS = {
    "LFU": "canopy.prefix.policies",
    "LRU": "canopy.prefix.policies",
    "POLICIES": "canopy.prefix.policies",
    "SIEVE": "canopy.prefix.policies",
    "Canopy": "canopy.prefix.policies",
    "EvictionPolicy": "canopy.prefix.policies",
    "Optimal": "canopy.prefix.policies",
    "make_policy": "canopy.prefix.policies",
    "OnlinePolicy": "canopy.prefix.stream",
    "RadixCache": "canopy.prefix.radix",
    "ReplayResult": "canopy.apps.cache.replay",
    "recovery_curve": "canopy.apps.cache.replay",
    "replay": "canopy.apps.cache.replay",
    "scenario": "canopy.apps.cache.replay",
    "sweep": "canopy.apps.cache.replay",
    "Trace": "canopy.prefix.traces",
    "from_paths": "canopy.prefix.traces",
    "load_mooncake": "canopy.prefix.traces",
    "load_prompt_log": "canopy.prefix.traces",
    "resolve": "canopy.prefix.traces",
    "TTFTModel": "canopy.prefix.ttft",
}

__all__ = [
    "LFU", "LRU", "POLICIES", "SIEVE", "Canopy", "EvictionPolicy", "OnlinePolicy", "Optimal",
    "RadixCache",
    "ReplayResult", "TTFTModel", "Trace", "from_paths", "load_mooncake", "load_prompt_log",
    "make_policy", "recovery_curve", "replay", "resolve", "scenario", "sweep",
]


lazy_exports(__name__, _EXPORTS)
