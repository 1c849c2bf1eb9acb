"""Canopy's descent against the PyXAB package (Li et al. 2023) on PyXAB's own synthetic
objectives: cumulative regret at horizons T and the policy's CPU time per round.

Not an experiment of the paper: it measures the library against the reference
implementations of HCT (Azar et al. 2014), VHCT (Li et al. 2022), POO (Grill et al. 2015)
wrapping truncated HOO, StoSOO (Valko et al. 2013) and truncated HOO (Bubeck et al. 2011),
each with PyXAB's own defaults and its binary partition (split in the middle along a random
dimension).

Canopy plays the same objectives on :class:`~canopy.tree.LazyTree` ``(2, dims=d)``: the
level-``l`` cell ``(l, i)`` is the box reached by ``l`` halvings along the ``d`` dimensions in
turn (the bits of ``i``, most significant first), and a probe of a cell is the objective at a
uniform point of the box plus the noise. The default descent plays centre probes (a probe of
the cell's deepest descendant holding its box's centre, ``LazyTree.centre``: PyXAB's point);
``canopy-edge`` is the default on ``LazyTree(2)`` without its dimensions, whose centre is the
middle path's point (on the 2-d Himmelblau the middle of an edge, centred along the dimension
the cell is halved in next and at the low end of the other; the default before box centres);
``canopy-paper`` plays the paper's uniform probe (Eq. 1) with Eq. (6)
and Eq. (4)'s radius and forgets any cell under the memory bound; ``canopy-eq4`` is the
default with Eq. (4)'s radius in place of MOSS's; ``canopy-own`` the default with a split
cell's own statistics in its ``U`` in place of its subtree's; ``canopy-uncapped``
is the default without its memory bound (the bound's diagnostic). Regret is the realised
one both ways, ``sum_t (f_max - f(x_t))`` over the points played (PyXAB's own ``f_max``;
Garland's is 1, 3e-5 above its true maximum, adding at most 3 at 100k rounds). Simple regret is
``f_max - f(x)`` at the point recommended after the run: the centre of the cell a Canopy
policy recommends (``recommend(1)``), PyXAB POO's ``get_last_point``.

Rewards are ``f(x) + N(0, sigma^2)`` from the seed's stream. Objectives: ``Garland``,
``DoubleSine``, ``DifficultFunc`` (on [0, 1]) and ``Himmelblau`` (PyXAB's normalised version,
``/890``, on [-5, 5]^2, so that its values share the noise's scale).

Time per round: process CPU time of the policy's own calls (PyXAB's ``pull`` +
``receive_reward``; Canopy's ``ask`` + ``tell``), in microseconds, both measured the same way:
after the run, the algorithm is run again from the same seed on the run's recorded
observations, in a plain loop with nothing else in it (no objective, no clock read), and that
loop is timed (each replays its run exactly: the same points, the same cells, checked).
PyXAB's HOO, POO and StoSOO refresh their
whole tree every round, so their cost per round grows with the round: past
``slow_max_horizon`` they are not run, HOO (the slowest: ~12 ms of CPU a round at 10k
rounds) past ``hoo_max_horizon``; Canopy's data-driven spreads past
``variants_max_horizon``.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from canopy.errors import MissingExtra
from canopy.experiments.studies._common import make_policy, policy_cell
from canopy.experiments.study import (
    Headline,
    Measurement,
    Panel,
    Row,
    Study,
    check_all_nonnegative,
)
from canopy.experiments.summary import lookup
from canopy.problem import ProblemSpec
from canopy.tree import LazyTree
from canopy.validation import check_count

__all__ = ["OBJECTIVES", "PYXAB_METHODS", "STUDY", "BoxCells", "PyXABParams"]

T_AXIS = "T"
DEFAULT = "canopy-default"
#: the target: the default's mean regret at most this times the best PyXAB mean
MEAN_FACTOR = 1.05

#: objective name -> (PyXAB module under ``PyXAB.synthetic_obj``, class, domain)
OBJECTIVES: dict[str, tuple[str, str, tuple[tuple[float, float], ...]]] = {
    "Garland": ("Garland", "Garland", ((0.0, 1.0),)),
    "DoubleSine": ("DoubleSine", "DoubleSine", ((0.0, 1.0),)),
    "DifficultFunc": ("DifficultFunc", "DifficultFunc", ((0.0, 1.0),)),
    "Himmelblau": ("Himmelblau", "Himmelblau_Normalized", ((-5.0, 5.0), (-5.0, 5.0))),
}

#: no memory bound in practice (the default's cap is ``2 b ceil(log_b T) + 1`` rows)
UNCAPPED = {"max_nodes": 10**7}
PAPER = "canopy-paper"
#: Canopy's methods: label -> (policy class, keywords): the default, the paper's Eq. 1 / Eq. 6
#: variant (the paper's rule), the default with each of its five options set back alone
#: (Eq. 6; uniform probes; forgetting any cell; Eq. 4's radius; a split cell's own
#: statistics, ``canopy-own``, the default before path statistics), the default on a tree
#: that does not know the boxes' dimensions (``canopy-edge``, the default before box
#: centres), the default without its memory bound, the two data-driven spreads, and POO over
#: its grid of L and over Grill et al.'s grid of rho
CANOPY_METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    DEFAULT: ("MemoryBoundedDescent", {}),
    PAPER: ("MemoryBoundedDescent", {"split": "eq6"}),
    "canopy-eq6": ("MemoryBoundedDescent", {"split": "eq6", "probe": "centre",
                                            "forget": "balanced"}),
    "canopy-uniform": ("MemoryBoundedDescent", {"probe": "uniform"}),
    "canopy-forget-any": ("MemoryBoundedDescent", {"forget": "any"}),
    "canopy-eq4": ("MemoryBoundedDescent", {"radius": "eq4"}),
    "canopy-own": ("MemoryBoundedDescent", {"stats": "own"}),
    "canopy-edge": ("MemoryBoundedDescent", {}),
    "canopy-uncapped": ("MemoryBoundedDescent", UNCAPPED),
    "canopy-certified": ("MemoryBoundedDescent", {"spread": "certified"}),
    "canopy-estimated": ("MemoryBoundedDescent", {"spread": "estimated"}),
    "canopy-poo-L": ("POO", {"c": None}),
    "canopy-poo-rho": ("POO", {"schedules": "rho", "c": None}),
}

#: Canopy's methods played on a tree that does not know the boxes' dimensions
EDGE = ("canopy-edge",)
#: Canopy's methods beside the default, run to ``variants_max_horizon`` (CPU time is scarce)
VARIANTS = ("canopy-certified", "canopy-estimated")
PYXAB_METHODS = ("pyxab-HCT", "pyxab-VHCT", "pyxab-POO", "pyxab-StoSOO", "pyxab-HOO")
#: the figure's methods (the table has them all)
SHOWN = (DEFAULT, "pyxab-HCT", "pyxab-VHCT")
#: PyXAB's algorithms whose per-round cost grows with the round (whole-tree refresh)
SLOW = ("pyxab-POO", "pyxab-StoSOO", "pyxab-HOO")
SLOWEST = "pyxab-HOO"  # ~12 ms of CPU a round at 10k rounds


@dataclass(frozen=True)
class PyXABParams:
    """Objectives, horizons and methods of the PyXAB comparison."""

    objectives: tuple[str, ...] = tuple(OBJECTIVES)
    horizons: tuple[int, ...] = (1000, 10000, 100000)
    sigma: float = 0.1
    canopy: tuple[str, ...] = tuple(CANOPY_METHODS)
    pyxab: tuple[str, ...] = PYXAB_METHODS
    slow_max_horizon: int = 10000
    hoo_max_horizon: int = 1000
    variants_max_horizon: int = 10000

    def __post_init__(self) -> None:
        for name, known, values in (("objectives", OBJECTIVES, self.objectives),
                                    ("canopy", CANOPY_METHODS, self.canopy),
                                    ("pyxab", PYXAB_METHODS, self.pyxab)):
            for value in values:
                if value not in known:
                    raise ValueError(f"{name}: unknown {value!r}; known: {', '.join(known)}")
        if not self.horizons:
            raise ValueError("horizons must not be empty")
        for horizon in self.horizons:
            check_count(horizon, "horizons")
        check_count(self.slow_max_horizon, "slow_max_horizon")
        check_count(self.hoo_max_horizon, "hoo_max_horizon")
        check_count(self.variants_max_horizon, "variants_max_horizon")
        check_all_nonnegative(sigma=self.sigma)


class BoxCells:
    """A PyXAB objective on the cells of ``LazyTree(2)`` (see the module docstring); keeps
    the cell and the noise-free value of every point it plays. A probe is at a uniform point
    of the cell (an unbiased sample of the cell's mean, Eq. 1); a policy playing centre probes
    asks for the cell's deepest descendant holding its centre, a box a point wide. The tree
    knows the boxes' dimensions (``dims``) unless ``geometry=False`` (then its centre is the
    middle path's point)."""

    def __init__(self, objective: Any, domain: Sequence[tuple[float, float]],
                 sigma: float, geometry: bool = True) -> None:
        self.objective = objective
        self.domain = np.asarray(domain, dtype=float)
        dims = len(self.domain) if geometry else 1
        self.spec = ProblemSpec(LazyTree(2, dims=dims), float(sigma), 1.0, 1.0)

        self.played: list[float] = []
        self.nodes: list[tuple[int, int]] = []

    def box(self, node: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """The box of cell ``(level, index)``: halvings along the dimensions in turn."""
        level, index = node
        low, high = self.domain[:, 0].copy(), self.domain[:, 1].copy()
        for step in range(level):
            dim = step % len(low)
            middle = (low[dim] + high[dim]) / 2
            if (index >> (level - 1 - step)) & 1:
                low[dim] = middle
            else:
                high[dim] = middle
        return low, high

    def probe(self, node: tuple[int, int], rng: np.random.Generator) -> float:
        low, high = self.box(node)
        value = float(self.objective.f(list(low + (high - low) * rng.random(len(low)))))
        self.played.append(value)
        self.nodes.append(node)
        return value + self.spec.sigma * rng.standard_normal()

    def centre_value(self, node: tuple[int, int]) -> float:
        """The noise-free objective at the centre of cell ``node``."""
        low, high = self.box(node)
        return float(self.objective.f(list((low + high) / 2)))

    def evaluate(self, leaf: int, rng: np.random.Generator) -> float:
        raise TypeError("an infinite-depth tree has no leaves to evaluate; probe its cells")


def _pyxab(path: str) -> Any:
    try:
        return importlib.import_module(f"PyXAB.{path}")
    except ImportError as error:
        raise MissingExtra("the pyxab study needs PyXAB: pip install PyXAB (in the 'dev' "
                           "extra)") from error


def objective(name: str) -> tuple[Any, tuple[tuple[float, float], ...]]:
    """A fresh PyXAB objective and its domain."""
    module, cls, domain = OBJECTIVES[name]
    return getattr(_pyxab(f"synthetic_obj.{module}"), cls)(), domain


def _pyxab_algorithm(method: str, rounds: int, domain: list[list[float]]) -> Any:
    algos = {name: _pyxab(f"algos.{name}") for name in ("HCT", "VHCT", "POO", "StoSOO", "HOO")}
    makers: dict[str, Callable[[], Any]] = {
        "pyxab-HCT": lambda: algos["HCT"].HCT(domain=domain),
        "pyxab-VHCT": lambda: algos["VHCT"].VHCT(domain=domain),
        "pyxab-POO": lambda: algos["POO"].POO(rounds=rounds, domain=domain,
                                              algo=algos["HOO"].T_HOO),
        "pyxab-StoSOO": lambda: algos["StoSOO"].StoSOO(n=rounds, domain=domain),
        "pyxab-HOO": lambda: algos["HOO"].T_HOO(rounds=rounds, domain=domain),
    }
    return makers[method]()


def _run_pyxab(cell: dict[str, Any], seed: int) -> tuple[float, float, float | None]:
    target, domain = objective(cell["objective"])
    rounds = int(cell["T"])
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x9A8]))
    noise = cell["sigma"] * rng.standard_normal(rounds)

    def algorithm() -> Any:
        np.random.seed(seed % 2**32)  # noqa: NPY002 - PyXAB draws from numpy's global stream
        return _pyxab_algorithm(cell["method"], rounds, [list(d) for d in domain])

    played, rewards, regret = algorithm(), [], 0.0
    points = []
    for t in range(1, rounds + 1):
        point = played.pull(t)
        value = float(target.f(point))
        regret += target.fmax - value
        points.append(list(point))
        rewards.append(value + noise[t - 1])
        played.receive_reward(t, rewards[-1])
    simple = (target.fmax - float(target.f(played.get_last_point()))
              if cell["method"] == "pyxab-POO" else None)
    return regret, _replay_pyxab(algorithm(), rewards, points), simple


def _replay_pyxab(algorithm: Any, rewards: list[float], points: list[list[float]]) -> float:
    """CPU seconds of ``pull`` + ``receive_reward`` alone: the run again on the same global
    seed, fed its recorded rewards (it then pulls the same points, checked after)."""
    pulled = []
    start = time.process_time()
    for t, reward in enumerate(rewards, 1):
        pulled.append(algorithm.pull(t))
        algorithm.receive_reward(t, reward)
    seconds = time.process_time() - start
    if [list(point) for point in pulled] != points:
        raise RuntimeError("PyXAB's replay pulled other points than its run")
    return seconds


def _play(policy: Any, problem: BoxCells, rounds: int, seed: int) -> list[float]:
    """Regret play of ``rounds`` probes in the user's own ask/tell loop (as PyXAB's is
    driven); returns the observations told, in order."""
    policy_seed, noise_seed = np.random.SeedSequence([seed, 0xC40]).spawn(2)
    policy.start(problem.spec, budget=float(rounds), seed=np.random.default_rng(policy_seed))
    rng = np.random.default_rng(noise_seed)
    told = []
    while (query := policy.ask()) is not None:
        told.append(problem.probe(query.node, rng))
        policy.tell(query, told[-1])
    return told


def _replay_canopy(policy: Any, spec: ProblemSpec, told: list[float]) -> tuple[list, float]:
    """The queried nodes and the CPU seconds of ``ask`` + ``tell`` alone: a fresh policy
    fed the recorded observations (the descent makes no random choice, so it asks the same
    queries)."""
    policy.start(spec, budget=float(len(told)), seed=0)
    observations, nodes = iter(told), []
    start = time.process_time()
    while (query := policy.ask()) is not None:
        nodes.append(query.node)
        policy.tell(query, next(observations))
    return nodes, time.process_time() - start


def _run_canopy(cell: dict[str, Any], seed: int) -> tuple[float, float, float | None]:
    target, domain = objective(cell["objective"])
    rounds = int(cell["T"])
    # a warm-up run first: the compiled kernels load once a process
    _play(make_policy(cell), BoxCells(target, domain, cell["sigma"], cell["geometry"]), 64,
          seed)
    problem = BoxCells(target, domain, cell["sigma"], cell["geometry"])
    policy = make_policy(cell)
    told = _play(policy, problem, rounds, seed)
    if len(problem.played) != rounds:
        raise RuntimeError(f"{cell['method']} played {len(problem.played)} of {rounds} rounds")
    level, index = policy.recommend(1)[0].tolist()
    simple = target.fmax - problem.centre_value((level, index))
    nodes, seconds = _replay_canopy(make_policy(cell), problem.spec, told)
    if nodes != problem.nodes:
        raise RuntimeError(f"{cell['method']}'s replay asked other cells than its run")
    return float(target.fmax * rounds - np.sum(problem.played)), seconds, simple


def _path_statistics(cell: dict[str, Any]) -> dict[str, str]:
    """``{"stats": "path"}`` for a method whose descent takes path statistics by default, so
    that its cells' keys differ from those of the same keywords computed before path
    statistics were the default (a store's older cells of it are computed again); else
    ``{}`` (a cell's own statistics: unchanged, and so is its key)."""
    policy = make_policy(cell)
    return {"stats": "path"} if getattr(policy, "stats_", "own") == "path" else {}


def cells(params: PyXABParams) -> list[dict[str, Any]]:
    methods = [policy_cell(name, CANOPY_METHODS[name][0], **CANOPY_METHODS[name][1])
               for name in params.canopy]
    methods = [{**method, "geometry": method["method"] not in EDGE, **_path_statistics(method)}
               for method in methods]
    methods += [{"method": name} for name in params.pyxab]
    return [{**method, "objective": name, "T": T, "sigma": params.sigma}
            for name in params.objectives for T in params.horizons for method in methods
            if not (method["method"] in SLOW and T > params.slow_max_horizon)
            and not (method["method"] == SLOWEST and T > params.hoo_max_horizon)
            and not (method["method"] in VARIANTS and T > params.variants_max_horizon)]


def run_cell(cell: dict[str, Any], seed: int) -> list[Measurement]:
    runner = _run_canopy if "policy" in cell else _run_pyxab
    regret, seconds, simple = runner(cell, seed)
    x, name, target = float(cell["T"]), cell["method"], cell["objective"]
    out = [Measurement(name, T_AXIS, x, "regret", regret, objective=target),
           Measurement(name, T_AXIS, x, "us per round", 1e6 * seconds / cell["T"],
                       objective=target)]
    if simple is not None:
        out.append(Measurement(name, T_AXIS, x, "simple regret", simple, objective=target))
    return out


def best_peer(rows: Sequence[Row], target: str, T: float) -> Row | None:
    """The PyXAB method of lowest mean regret on ``target`` at horizon ``T``."""
    peers = [r for r in rows if r.method in PYXAB_METHODS and r.metric == "regret"
             and r.objective == target and r.x == T]
    return min(peers, key=lambda r: r.mean, default=None)


def headlines(rows: Sequence[Row]) -> list[Headline]:
    out = []
    for target in dict.fromkeys(r.objective for r in rows):
        for T in sorted({r.x for r in rows if r.objective == target and r.x is not None}):
            ours = lookup(rows, DEFAULT, "regret", T, objective=target)
            peer = best_peer(rows, target, T)
            if ours is None or peer is None:
                continue
            out.append(Headline(f"{target}, T={T:g}: {DEFAULT} regret vs {peer.method}",
                                ours.mean, ours.ci_low, ours.ci_high,
                                target=f"mean <= {MEAN_FACTOR:g}x {peer.method}'s mean "
                                       f"{peer.mean:,.0f}",
                                passed=ours.mean <= MEAN_FACTOR * peer.mean))
            mine = lookup(rows, DEFAULT, "us per round", T, objective=target)
            theirs = [r for r in rows if r.method in PYXAB_METHODS and r.x == T
                      and r.objective == target and r.metric == "us per round"]
            if mine is not None and theirs:
                fastest = min(theirs, key=lambda r: r.mean)
                speedup = fastest.mean / mine.mean
                out.append(Headline(f"{target}, T={T:g}: speed-up over {fastest.method} "
                                    "(fastest PyXAB) per round", speedup,
                                    target=">= 50x", passed=speedup >= 50))
                out.append(Headline(f"{target}, T={T:g}: {DEFAULT} CPU time per round (us)",
                                    mine.mean, target="<= 2 us", passed=mine.mean <= 2.0))
    return out


STUDY = Study(
    name="pyxab",
    title="Canopy's descent vs PyXAB (HCT, VHCT, POO, StoSOO, HOO) on PyXAB's objectives",
    module=__name__,
    params=PyXABParams(),
    quick_params=PyXABParams(horizons=(1000, 10000)),
    seeds=3,
    quick_seeds=2,
    cells=cells,
    run_cell=run_cell,
    headlines=headlines,
    panels=(Panel("regret", T_AXIS, log_x=True, log_y=True, methods=SHOWN,
                  title="cumulative regret"),
            Panel("us per round", T_AXIS, log_x=True, log_y=True, methods=SHOWN,
                  title="CPU time per round (us)")),
)
