"""The block tree of prefix caching (paper Section 4, "Serving systems"; Appendix E), shared by
every host of a prefix cache: request traces as paths in one prefix tree of KV blocks
(:mod:`~canopy.prefix.traces`), the per-request numba kernels over its node tables
(:mod:`~canopy.prefix.kernels`), eviction policies swapped by name
(:mod:`~canopy.prefix.policies`), the cache over a whole trace (:class:`RadixCache`) or fed
one request at a time (:mod:`~canopy.prefix.stream`), the order an engine's free blocks leave
in (:mod:`~canopy.prefix.evictable`) and the time-to-first-token model
(:mod:`~canopy.prefix.ttft`). Applications (the cache replay, the fleet simulator) and the
engine integrations (vLLM, SGLang, llama.cpp) stand on it."""

from canopy._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("EvictableBlocks", "EvictionOrder"), "canopy.prefix.evictable"),
    "BlockTree": "canopy.prefix.blocks",
    "KeyTree": "canopy.prefix.hashindex",
    "RadixCache": "canopy.prefix.radix",
    **dict.fromkeys(("LFU", "LRU", "POLICIES", "SIEVE", "Canopy", "EvictionPolicy", "Optimal",
                     "PriorityPolicy", "make_policy", "policy_class", "resolve_policy"),
                    "canopy.prefix.policies"),
    **dict.fromkeys(("OnlinePolicy", "PlannedCache", "StreamingCache", "replay_stream"),
                    "canopy.prefix.stream"),
    **dict.fromkeys(("MOONCAKE_BLOCK_TOKENS", "TRACE_FILES", "Trace", "from_paths",
                     "full_blocks", "iter_mooncake", "load_mooncake", "load_prompt_log",
                     "resolve", "shifted"), "canopy.prefix.traces"),
    "TTFTModel": "canopy.prefix.ttft",
}

__all__ = sorted(_EXPORTS)

lazy_exports(__name__, _EXPORTS)
