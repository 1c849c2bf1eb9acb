"""Region tree: task categories as a tree of ``/``-separated paths.

A region path such as ``"stem/physics"`` names a node; every prefix (``"stem"``) is its
parent region and the empty path is the root (the whole pool). Queries may sit at any node.
The regional learners share statistics along this tree (paper Section 4, "Routing": the
depth-one or shallow case of the tree bandit).

Paths are bounded (``MAX_DEPTH`` levels, ``MAX_LENGTH`` characters): a region is a
client-supplied string in the proxy, and every node costs memory in every learner. Insertion
and the ancestor table are linear in the number of nodes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import numpy as np

__all__ = ["MAX_DEPTH", "MAX_LENGTH", "RegionTree", "normalize_region"]

MAX_DEPTH = 16
MAX_LENGTH = 256


def normalize_region(region: str) -> str:
    """``" STEM//physics/ "`` -> ``"STEM/physics"``; refuses a non-string, and a path deeper
    than ``MAX_DEPTH`` levels or longer than ``MAX_LENGTH`` characters."""
    if not isinstance(region, str):
        raise TypeError(f"region must be a string path such as 'stem/physics', got "
                        f"{type(region).__name__}")
    return _normalized(region)


@functools.lru_cache(maxsize=4096)  # every request's region is read several times
def _normalized(region: str) -> str:
    if len(region) > 4 * MAX_LENGTH:  # do not even split an absurd string
        raise ValueError(f"region path has {len(region)} characters; at most {MAX_LENGTH}")
    parts = [part.strip() for part in region.split("/") if part.strip()]
    path = "/".join(parts)
    if len(parts) > MAX_DEPTH:
        raise ValueError(f"region path has {len(parts)} levels; at most {MAX_DEPTH}")
    if len(path) > MAX_LENGTH:
        raise ValueError(f"region path has {len(path)} characters; at most {MAX_LENGTH}")
    return path


class RegionTree:
    """A growable prefix tree of region paths. Node 0 is the root ``""``.

    ``ancestors`` is a padded array: row ``v`` lists the nodes from the root down to ``v``
    (``-1`` after the end), the layout the numba learners walk.
    """

    def __init__(self, regions: Iterable[str] = ()) -> None:
        self._index: dict[str, int] = {"": 0}
        self._paths: list[str] = [""]
        self._parent: list[int] = [-1]
        self._depth: list[int] = [0]
        self._chains: list[tuple[int, ...]] = [(0,)]
        for region in regions:
            self.add(region)

    def add(self, region: str) -> int:
        """Node of ``region``, creating it and its missing prefixes."""
        path = normalize_region(region)
        node = self._index.get(path)
        if node is not None:
            return node
        parts = path.split("/")
        node = 0
        for end in range(1, len(parts) + 1):
            prefix = "/".join(parts[:end])
            child = self._index.get(prefix)
            if child is None:
                child = len(self._paths)
                self._index[prefix] = child
                self._paths.append(prefix)
                self._parent.append(node)
                self._depth.append(end)
                self._chains.append((*self._chains[node], child))
            node = child
        return node

    def node(self, region: str) -> int:
        """Node of a known region; ``KeyError`` naming it when unknown."""
        path = normalize_region(region)
        try:
            return self._index[path]
        except KeyError:
            known = sorted(path or "(root)" for path in self._index)
            more = f" and {len(known) - 10} more" if len(known) > 10 else ""
            raise KeyError(f"unknown region {region!r}; known: {', '.join(known[:10])}"
                           f"{more}") from None

    def nearest(self, region: str) -> int:
        """Node of ``region`` or of its deepest known prefix (the root at worst)."""
        parts = normalize_region(region).split("/")
        for end in range(len(parts), 0, -1):
            node = self._index.get("/".join(parts[:end]))
            if node is not None:
                return node
        return 0

    def path(self, node: int) -> str:
        return self._paths[node]

    def parent(self, node: int) -> int:
        return self._parent[node]

    @property
    def n_nodes(self) -> int:
        return len(self._paths)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self._paths)

    @property
    def max_depth(self) -> int:
        return max(self._depth)

    def chain(self, node: int) -> tuple[int, ...]:
        """Nodes from the root down to ``node``."""
        return self._chains[node]

    def ancestors(self, start: int = 0) -> np.ndarray:
        """``(n_nodes - start, MAX_DEPTH + 1)`` int64: root-to-node chains of the nodes from
        ``start`` on, padded with ``-1``."""
        table = np.full((self.n_nodes - start, MAX_DEPTH + 1), -1, dtype=np.int64)
        for row, chain in enumerate(self._chains[start:]):
            table[row, :len(chain)] = chain
        return table

    def __contains__(self, region: object) -> bool:
        return isinstance(region, str) and normalize_region(region) in self._index

    def __repr__(self) -> str:
        return f"RegionTree(n_nodes={self.n_nodes}, max_depth={self.max_depth})"
