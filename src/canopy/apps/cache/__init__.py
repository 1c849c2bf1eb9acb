"""Prefix-cache eviction (paper Section 4, "Serving systems"; Appendix E): a radix block cache,
eviction policies swapped by name, trace readers and replay scenarios."""

from canopy.apps.cache.policies import (
    LFU,
    LRU,
    POLICIES,
    SIEVE,
    Canopy,
    EvictionPolicy,
    Optimal,
    make_policy,
)
from canopy.apps.cache.radix import RadixCache
from canopy.apps.cache.replay import ReplayResult, recovery_curve, replay, scenario, sweep
from canopy.apps.cache.traces import Trace, from_paths, load_mooncake, load_prompt_log, resolve
from canopy.apps.cache.ttft import TTFTModel

__all__ = [
    "LFU", "LRU", "POLICIES", "SIEVE", "Canopy", "EvictionPolicy", "Optimal", "RadixCache",
    "ReplayResult", "TTFTModel", "Trace", "from_paths", "load_mooncake", "load_prompt_log",
    "make_policy", "recovery_curve", "replay", "resolve", "scenario", "sweep",
]
