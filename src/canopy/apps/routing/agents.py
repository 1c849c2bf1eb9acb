"""Per-call routing inside a multi-turn agent (paper Appendix E, the tau-bench experiment):
the region is a feature of the turn, the arm is the model for that call, and the episode's
terminal reward is credited to every (region, model) pull of the episode.

tau2-bench is not on the package registries, so this is a small seeded environment whose
per-phase best model is known (``SUCCESS``): an episode of a given difficulty runs the
phases ``plan, tool, tool, code, answer``; each call succeeds with the probability of its
(phase, difficulty, model), and the episode succeeds (reward 1) only if every call does.
Its utility is ``reward - lam * (cost of its calls)``. The best policy per (phase,
difficulty) is found by enumeration (:func:`oracle_policy`), so a learner's loss against it
is exact.

Learners: ``regional`` (region ``phase/difficulty``; the shared statistics of
:class:`~canopy.regional.RegionalRouter`), ``flat`` (one region), and the same regional
learner credited each call's own success instead of the terminal reward (``regional-percall``:
what credit assignment would give if the environment revealed it).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from canopy.regional.router import FlatRouter, RegionalRouter
from canopy.stats import t_interval
from canopy.validation import check_count, check_nonnegative

__all__ = ["COST", "LEARNERS", "PHASES", "SUCCESS", "AgentResult", "oracle_policy",
           "run_agents", "summarize_agents"]

PHASES = ("plan", "tool", "tool", "code", "answer")
DIFFICULTIES = ("easy", "hard")
MODELS = ("small", "medium", "large", "coder")
COST = {"small": 0.001, "medium": 0.004, "large": 0.02, "coder": 0.006}  # dollars a call
# P(call succeeds) per phase and difficulty, models in MODELS order: the cheap model is
# enough for tool calls, the code model for code, the large model for hard planning.
SUCCESS = {
    ("plan", "easy"): (0.85, 0.90, 0.95, 0.80), ("plan", "hard"): (0.40, 0.60, 0.90, 0.50),
    ("tool", "easy"): (0.95, 0.95, 0.96, 0.90), ("tool", "hard"): (0.85, 0.90, 0.92, 0.85),
    ("code", "easy"): (0.50, 0.70, 0.80, 0.95), ("code", "hard"): (0.20, 0.40, 0.60, 0.90),
    ("answer", "easy"): (0.90, 0.92, 0.95, 0.70), ("answer", "hard"): (0.60, 0.80, 0.90, 0.60),
}
LEARNERS = ("regional", "flat", "regional-percall")


def _utility(difficulty: str, choice: dict[str, str], lam: float) -> float:
    """Expected utility of an episode under a fixed model per phase."""
    success, cost = 1.0, 0.0
    for phase in PHASES:
        model = choice[phase]
        success *= SUCCESS[phase, difficulty][MODELS.index(model)]
        cost += COST[model]
    return success - lam * cost


def oracle_policy(lam: float) -> tuple[dict[str, dict[str, str]], dict[str, float]]:
    """The best model per phase for each difficulty (by enumeration: the episode's success is
    a product, so phases are not separable once cost counts) and its expected utility."""
    phases = tuple(dict.fromkeys(PHASES))
    policy, value = {}, {}
    for difficulty in DIFFICULTIES:
        best = max((dict(zip(phases, models, strict=True))
                    for models in itertools.product(MODELS, repeat=len(phases))),
                   key=lambda choice: _utility(difficulty, choice, lam))
        policy[difficulty], value[difficulty] = best, _utility(difficulty, best, lam)
    return policy, value


def _best_single(lam: float) -> tuple[str, float]:
    """The best one model for every call, and its expected utility (difficulties equally
    likely)."""
    values = {m: np.mean([_utility(d, dict.fromkeys(PHASES, m), lam) for d in DIFFICULTIES])
              for m in MODELS}
    model = max(values, key=values.__getitem__)
    return model, float(values[model])


@dataclass(frozen=True)
class AgentResult:
    """One learner in one replicate: mean utility and success over all episodes and over the
    last quarter, and how often its calls matched the oracle's model."""

    learner: str
    replicate: int
    utility: float
    utility_last: float
    success: float
    cost: float
    oracle_match: float


def _router(learner: str, lam: float, seed: int, bandit: str) -> RegionalRouter:
    kind = FlatRouter if learner == "flat" else RegionalRouter
    return kind(MODELS, lam=lam, learner=bandit, seed=seed)


def _episode(router: RegionalRouter, rng: np.random.Generator, per_call: bool,
             policy: dict[str, dict[str, str]]) -> tuple[float, float, int]:
    difficulty = DIFFICULTIES[int(rng.integers(len(DIFFICULTIES)))]
    calls, matches = [], 0
    for phase in PHASES:
        region = f"{phase}/{difficulty}"
        model = router.route(region)
        ok = bool(rng.random() < SUCCESS[phase, difficulty][MODELS.index(model)])
        calls.append((region, model, ok))
        matches += model == policy[difficulty][phase]
    reward = float(all(ok for _, _, ok in calls))
    cost = sum(COST[model] for _, model, _ in calls)
    for region, model, ok in calls:  # the terminal reward credited to every pull
        router.update(region, model, float(ok) if per_call else reward, COST[model])
    return reward, cost, matches


def run_agents(*, episodes: int = 2000, replicates: int = 10, lam: float = 5.0,
               learners: Sequence[str] = LEARNERS, bandit: str = "thompson", seed: int = 0,
               progress: Callable[[int, int], None] | None = None) -> list[AgentResult]:
    """Every learner for ``episodes`` episodes in each of ``replicates`` seeded replicates
    (the same episode stream for every learner within a replicate)."""
    unknown = set(learners) - set(LEARNERS)
    if unknown:
        raise ValueError(f"unknown learners {sorted(unknown)}; choose from {list(LEARNERS)}")
    if bandit not in ("thompson", "ucb"):
        raise ValueError(f"bandit must be 'thompson' or 'ucb', got {bandit!r}")
    check_count(episodes, "episodes", low=4)
    check_count(replicates, "replicates")
    check_nonnegative(lam, "lam")
    policy, _ = oracle_policy(lam)
    results, done, total = [], 0, replicates * len(learners)
    for replicate in range(replicates):
        for learner in learners:
            rng = np.random.default_rng([seed, replicate])
            router = _router(learner, lam, replicate, bandit)
            rows = np.array([_episode(router, rng, learner == "regional-percall", policy)
                             for _ in range(episodes)])
            utility = rows[:, 0] - lam * rows[:, 1]
            results.append(AgentResult(
                learner, replicate, float(utility.mean()),
                float(utility[-(episodes // 4):].mean()), float(rows[:, 0].mean()),
                float(rows[:, 1].mean()), float(rows[:, 2].sum() / (episodes * len(PHASES)))))
            done += 1
            if progress is not None:
                progress(done, total)
    return results


_FRACTIONS = frozenset({"success", "oracle_match"})


def summarize_agents(results: Sequence[AgentResult], lam: float) -> dict[str, object]:
    """Per learner: mean and 95% t-interval over replicates of each measure; the oracle's
    and the best single model's expected utility for reference."""
    rows = []
    for learner in dict.fromkeys(r.learner for r in results):
        mine = [r for r in results if r.learner == learner]
        row: dict[str, object] = {"learner": learner, "replicates": len(mine)}
        for measure in ("utility", "utility_last", "success", "cost", "oracle_match"):
            # success and oracle_match are fractions: their intervals stay in [0, 1]
            bounds = (0.0, 1.0) if measure in _FRACTIONS else None
            mean, low, high = t_interval([getattr(r, measure) for r in mine], bounds=bounds)
            row |= {measure: mean, f"{measure}_ci": [low, high]}
        rows.append(row)
    policy, value = oracle_policy(lam)
    single, single_value = _best_single(lam)
    return {"lam": lam, "rows": rows, "oracle": {"policy": policy,
                                                 "utility": float(np.mean(list(value.values())))},
            "best_single_model": {"model": single, "utility": single_value}}
