"""Baselines with an assumed smoothness: HOO (Bubeck et al., 2011) and POO (Grill, Valko and
Munos, 2015), on the same explored-tree kernels as the descent (Section 3.2).

HOO keeps *path* statistics: an observation counts at every node on the path from the root to
the played node, ``U(v) = mean(v) + c sqrt(2 ln t / T(v)) + nu1 rho^level`` with
``nu1 = lipschitz``, and each round adds one node to the explored tree (the played node is
split after its first play). Unlike the original, ``U`` and ``B`` are refreshed on the played
path only (off-path values are stale between visits, as in HCT and truncated HOO), which keeps a
round O(depth) instead of O(explored nodes).

POO runs one HOO per schedule ``(lipschitz, rho)`` of a grid, round-robin with equal shares
(each instance counts its own ``t``), and recommends from the instance whose plays have the
highest empirical mean reward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from canopy.policies import _explored as ex
from canopy.policies.descent import (
    ExploredTreePolicy,
    max_branching,
    radius_scale,
    spec_rounds,
)
from canopy.validation import check_count, check_open_unit, check_positive

__all__ = ["HOO", "POO", "default_schedules", "rho_schedules"]


class HOO(ExploredTreePolicy):
    """Hierarchical optimistic optimization with an assumed schedule ``nu1 rho^level``.

    Args:
        lipschitz: ``nu1`` (> 0).
        rho: in (0, 1); ``None`` is ``1 / max number of children``.
        c: scale of the confidence radius (> 0).
    """

    name = "hoo"

    def __init__(self, *, lipschitz: float = 1.0, rho: float | None = None,
                 c: float = 1.0) -> None:
        check_positive(lipschitz, "lipschitz")
        check_open_unit(rho, "rho", allow_none=True)
        check_positive(c, "c")
        self.lipschitz, self.rho, self.c = lipschitz, rho, c

    def _start(self) -> None:
        self._begin(schedules=[(self.lipschitz, self.rho)], spread="assumed", expand="always",
                    max_depth=None, path_stats=True, c=self.c)


def default_schedules(n_rounds: float) -> list[tuple[float, float | None]]:
    """POO's default grid: ``N = max(3, ceil(0.5 ln(n / ln n)))`` instances (Grill et al.'s
    count with ``D_max = 1``, which ``rho = 1/b`` gives), ``rho = 1/b`` and ``L`` log-spaced
    over ``[1/16, 4]`` (the tree fixes the ratio; the unknown is the constant)."""
    n = max(float(n_rounds), 3.0)
    count = max(3, math.ceil(0.5 * math.log(n / math.log(n))))
    return [(float(lip), None) for lip in np.geomspace(1.0 / 16.0, 4.0, count)]


def rho_schedules(n_rounds: float, *, arity: int = 2, rho_max: float = 0.9,
                  lipschitz: float = 1.0) -> list[tuple[float, float | None]]:
    """Grill et al.'s (2015) grid over ``rho``: ``N = ceil(0.5 D_max ln(n / ln n))``
    instances, ``D_max = ln(arity) / ln(1 / rho_max)``, ``rho_i = rho_max^(2N / (2i + 1))``
    for ``i = 0 .. N - 1``, each with ``nu = lipschitz`` (their ``nu_max``)."""
    check_count(arity, "arity", low=2)
    check_open_unit(rho_max, "rho_max")
    check_positive(lipschitz, "lipschitz")
    n = max(float(n_rounds), 3.0)
    d_max = math.log(arity) / math.log(1.0 / rho_max)
    count = max(1, math.ceil(0.5 * d_max * math.log(n / math.log(n))))
    return [(float(lipschitz), rho_max ** (2.0 * count / (2 * i + 1))) for i in range(count)]


class POO(ExploredTreePolicy):
    """Parallel optimistic optimization over a grid of assumed schedules.

    Args:
        schedules: ``(lipschitz, rho)`` pairs (``rho=None`` is ``1/b``); ``None`` is
            :func:`default_schedules` for the run's horizon (a grid over ``L``), ``"rho"``
            :func:`rho_schedules` for the run's horizon and the tree's arity (Grill et al.'s
            grid over ``rho``).
        c: scale of every instance's confidence radius (> 0); ``None`` is the problem's
            noise sd (:func:`~canopy.policies.descent.radius_scale`).
    """

    name = "poo"

    def __init__(self, *, schedules: Sequence[tuple[float, float | None]] | str | None = None,
                 c: float | None = 1.0) -> None:
        if isinstance(schedules, str):
            if schedules != "rho":
                raise ValueError(f'schedules must be pairs, None or "rho", got {schedules!r}')
        elif schedules is not None:
            for i, (lip, rho) in enumerate(schedules):
                check_positive(lip, f"schedules[{i}] lipschitz")
                check_open_unit(rho, f"schedules[{i}] rho", allow_none=True)
            if not len(schedules):
                raise ValueError("schedules is empty: POO needs at least one (lipschitz, rho)")
        if c is not None:
            check_positive(c, "c")
        self.schedules, self.c = schedules, c

    def _start(self) -> None:
        grid = self.schedules
        rounds = spec_rounds(self.spec_, self.ledger_.budget)
        if grid is None:
            grid = default_schedules(rounds)
        elif isinstance(grid, str):
            grid = rho_schedules(rounds, arity=max(2, max_branching(self.spec_.tree)))
        self.schedules_ = [(float(lip), None if rho is None else float(rho))
                           for lip, rho in grid]
        self._begin(schedules=self.schedules_, spread="assumed", expand="always",
                    max_depth=None, path_stats=True, c=radius_scale(self.c, self.spec_))

    def _best_root(self) -> int:
        roots = self._fs[:len(self.schedules_)]
        played = roots[:, ex.COUNT] > 0
        if not played.any():
            return 0
        return int(np.argmax(np.where(played, roots[:, ex.MEAN], -np.inf)))
