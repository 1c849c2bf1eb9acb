"""The radix block cache of a whole trace (the replay's host; paper Section 4, "Serving
systems").

A request (a root-first path of blocks, :class:`~canopy.prefix.traces.Trace`) reuses its
longest cached prefix (reuse stops at the first miss), then inserts its remaining blocks,
pinned while it runs; victims are unpinned leaves only, so the cache stays ancestor-closed.
The state is a :class:`~canopy.prefix.blocks.BlockTree` over the trace's block universe, the
kernels those of :mod:`canopy.prefix.kernels`.
"""

from __future__ import annotations

import numpy as np

from canopy.prefix.blocks import BlockTree
from canopy.prefix.policies import EvictionPolicy
from canopy.prefix.traces import Trace
from canopy.validation import check_count

__all__ = ["RadixCache"]


class RadixCache:
    """The cache for one trace's block universe, one policy and a capacity in blocks.

    ``policy`` is an eviction policy object from :mod:`canopy.prefix.policies`. Requests
    are processed in trace order with :meth:`run` (or :meth:`step`); ``reused_[i]`` holds the
    prefix-constrained number of blocks request ``i`` found cached.
    """

    def __init__(self, trace: Trace, policy: EvictionPolicy, capacity: int) -> None:
        self.trace = trace
        self.policy = policy
        self.capacity = check_count(capacity, "capacity")
        self.tree = BlockTree(policy, self.capacity, trace=trace)
        self.reused_ = np.zeros(trace.n_requests, dtype=np.int64)
        self.next_request_ = 0

    def run(self, stop: int | None = None) -> np.ndarray:
        """Process requests up to ``stop`` (default: all); returns their reused blocks."""
        stop = self.trace.n_requests if stop is None else stop
        if not self.next_request_ <= stop <= self.trace.n_requests:
            raise ValueError(f"stop must be in {self.next_request_}..{self.trace.n_requests}, "
                             f"got {stop}")
        self.tree.run(self.next_request_, stop, self.reused_)
        start, self.next_request_ = self.next_request_, stop
        return self.reused_[start:stop]

    def step(self) -> int:
        """Process the next request; returns the blocks it reused."""
        return int(self.run(self.next_request_ + 1)[0])

    @property
    def size(self) -> int:
        """Blocks cached now."""
        return self.tree.size

    @property
    def arm(self) -> int:
        """``canopy``: the arm whose priority evicts now (index into ``policy.arm_names``)."""
        return self.tree.arm

    @property
    def switches(self) -> int:
        """``canopy``: how many times the evicting arm changed."""
        return self.tree.switches

    @property
    def table(self) -> np.ndarray:
        """The node table: one row of cache fields (``CACHED``, ``HITS``, ``LAST``...) a
        node; read-only for callers."""
        return self.tree.table

    def cached(self) -> np.ndarray:
        """Node ids cached now, ascending."""
        return self.tree.cached()
