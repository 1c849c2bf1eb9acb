"""A user's own eviction policy, in a module of its own as a user would write it: the hosts
load it by the spec ``user_policy:NewestFirst`` (this folder on the path)."""

from __future__ import annotations

import numba

from canopy.prefix import kernels as radix
from canopy.prefix.policies import PriorityPolicy


@numba.njit
def newest_first(v, ni, depth, params):
    return -float(ni[v, radix.LAST])  # the most recently used leaf goes first


class NewestFirst(PriorityPolicy):
    """Most recently used first (MRU): what keeps most of a cyclic scan longer than the
    cache, where LRU keeps nothing. Its key rises from a block to its parent's, so only a
    host that evicts leaves alone evicts what the replay evicts."""

    name = "newest-first"
    key = staticmethod(newest_first)


class NeedsArguments(NewestFirst):
    """Not makeable from a spec: its constructor wants an argument."""

    def __init__(self, weight: float) -> None:
        self.weight = weight


class CalledSieve(NewestFirst):
    """Refused: a built-in policy's name would stand for two policies."""

    name = "sieve"


NOT_A_POLICY = 3


@numba.njit
def newest_first_until_200(v, ni, depth, params):
    if ni[v, radix.LAST] > 200:
        raise ValueError("the clock passed 200")
    return -float(ni[v, radix.LAST])


class RaisesAfter200(NewestFirst):
    """A user's bug: its key raises ``ValueError`` once the clock passes request 200."""

    name = "raises-after-200"
    key = staticmethod(newest_first_until_200)


@numba.njit
def newest_first_until_8(v, ni, depth, params):
    if ni[v, radix.LAST] > 8:
        raise ValueError("the clock passed 8")
    return -float(ni[v, radix.LAST])


class RaisesAfter8(NewestFirst):
    """:class:`RaisesAfter200` for a run of a few requests (a live server's)."""

    name = "raises-after-8"
    key = staticmethod(newest_first_until_8)


@numba.njit
def always_raises(v, ni, depth, params):
    raise ValueError("a bug from the first call")


class RaisesAlways(NewestFirst):
    """A user's bug from the start: its key always raises ``ValueError``."""

    name = "raises-always"
    key = staticmethod(always_raises)
