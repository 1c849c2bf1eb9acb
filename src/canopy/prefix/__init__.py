"""The block tree of prefix caching (paper Section 4, "Serving systems"; Appendix E), shared by
every host of a prefix cache: request traces as paths in one prefix tree of KV blocks
(:mod:`~canopy.prefix.traces`), the per-request numba kernels over its node tables
(:mod:`~canopy.prefix.kernels`), eviction policies swapped by name
(:mod:`~canopy.prefix.policies`), the cache over a whole trace (:class:`RadixCache`) or fed
one request at a time (:mod:`~canopy.prefix.stream`), the order an engine's free blocks leave
in (:mod:`~canopy.prefix.evictable`) and the time-to-first-token model
(:mod:`~canopy.prefix.ttft`). Applications (the cache replay, the fleet simulator) and the
engine integrations (vLLM, SGLang, llama.cpp) stand on it."""

from typing import TYPE_CHECKING

from canopy._lazy import lazy_exports

if TYPE_CHECKING:  # the lazy exports as the type checker sees them (re-exported)
    from canopy.prefix.blocks import BlockTree as BlockTree
    from canopy.prefix.evictable import EvictableBlocks as EvictableBlocks
    from canopy.prefix.evictable import EvictionOrder as EvictionOrder
    from canopy.prefix.hashindex import KeyTree as KeyTree
    from canopy.prefix.policies import LFU as LFU
    from canopy.prefix.policies import LRU as LRU
    from canopy.prefix.policies import POLICIES as POLICIES
    from canopy.prefix.policies import SIEVE as SIEVE
    from canopy.prefix.policies import Canopy as Canopy
    from canopy.prefix.policies import EvictionPolicy as EvictionPolicy
    from canopy.prefix.policies import Optimal as Optimal
    from canopy.prefix.policies import PriorityPolicy as PriorityPolicy
    from canopy.prefix.policies import make_policy as make_policy
    from canopy.prefix.policies import policy_class as policy_class
    from canopy.prefix.policies import resolve_policy as resolve_policy
    from canopy.prefix.radix import RadixCache as RadixCache
    from canopy.prefix.stream import OnlinePolicy as OnlinePolicy
    from canopy.prefix.stream import PlannedCache as PlannedCache
    from canopy.prefix.stream import StreamingCache as StreamingCache
    from canopy.prefix.stream import replay_stream as replay_stream
    from canopy.prefix.traces import MOONCAKE_BLOCK_TOKENS as MOONCAKE_BLOCK_TOKENS
    from canopy.prefix.traces import TRACE_FILES as TRACE_FILES
    from canopy.prefix.traces import Trace as Trace
    from canopy.prefix.traces import from_paths as from_paths
    from canopy.prefix.traces import full_blocks as full_blocks
    from canopy.prefix.traces import iter_mooncake as iter_mooncake
    from canopy.prefix.traces import load_mooncake as load_mooncake
    from canopy.prefix.traces import load_prompt_log as load_prompt_log
    from canopy.prefix.traces import resolve as resolve
    from canopy.prefix.traces import shifted as shifted
    from canopy.prefix.ttft import TTFTModel as TTFTModel

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
