"""Routers, regions, prices, AIQ: behaviour on synthetic outcomes with fixed seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from canopy.apps.routing import (
    CategoryOracle,
    FixedRouter,
    FlatRouter,
    Outcomes,
    PriceTable,
    QueryOracle,
    RandomRouter,
    RegionalRouter,
    RegionTree,
    ThompsonRouter,
    aiq,
    estimate_tokens,
    nondecreasing_hull,
    replay,
)

MODELS = ("cheap", "strong")


def synthetic(seed: int = 0, per_region: int = 300) -> Outcomes:
    """Two groups of regions: in ``easy/*`` the cheap model is as good as the strong one,
    in ``hard/*`` it is far worse. Bernoulli quality, costs 0.1 and 1.0."""
    rng = np.random.default_rng(seed)
    regions, quality = [], []
    for group, cheap_p in (("easy", 0.8), ("hard", 0.2)):
        for r in range(4):
            for _ in range(per_region):
                regions.append(f"{group}/r{r}")
                quality.append([rng.random() < cheap_p, rng.random() < 0.85])
    n = len(regions)
    cost = np.tile([0.1, 1.0], (n, 1))
    return Outcomes("synthetic", tuple(f"q{i}" for i in range(n)), tuple(regions), MODELS,
                    np.array(quality, float), cost)


def test_region_tree_paths_and_ancestors():
    tree = RegionTree(["stem/physics", "stem/math", "humanities"])
    assert tree.paths == ("", "stem", "stem/physics", "stem/math", "humanities")
    assert tree.node(" stem//physics/ ") == 2
    assert tree.nearest("stem/chemistry/organic") == tree.node("stem")
    assert tree.nearest("law") == 0
    assert tree.chain(2) == (0, 1, 2)
    assert tree.ancestors()[2].tolist()[:4] == [0, 1, 2, -1]
    assert tree.ancestors()[4].tolist()[:3] == [0, 4, -1]
    with pytest.raises(KeyError, match="unknown region"):
        tree.node("law")
    with pytest.raises(TypeError, match="region"):
        tree.add(3)  # type: ignore[arg-type]


def test_price_table_refuses_unpriced_models_and_bad_tokens():
    table = PriceTable.default()
    assert table.version
    assert math.isclose(table.cost("gpt-4-1106-preview", 1_000_000, 0), 10.0)
    with pytest.raises(KeyError, match="no price for model 'nobody'"):
        table.cost("nobody", 10, 10)
    with pytest.raises(ValueError, match="input_tokens"):
        table.cost("gpt-4-1106-preview", -1, 10)
    with pytest.raises(ValueError, match="price of 'x'"):
        PriceTable.from_mapping({"version": "1", "models": {"x": {"input": 1.0}}})
    with pytest.raises(ValueError, match="price input"):
        PriceTable.from_mapping({"version": "1", "models": {"x": {"input": -1, "output": 1}}})
    assert estimate_tokens("") == 1 and estimate_tokens("abcdefghi") == 3


@pytest.mark.parametrize("make", [
    lambda: RegionalRouter(MODELS, lam=0.1, seed=3),
    lambda: ThompsonRouter(MODELS, lam=0.1, seed=3),
    lambda: FlatRouter(MODELS, lam=0.1, seed=3),
])
def test_bad_feedback_is_refused_and_state_unchanged(make):
    router = make()
    router.update("stem/physics", "cheap", 0.5, 0.01)
    before = router.state()
    bad = [("nobody", 0.5, 0.01, KeyError), ("cheap", 1.5, 0.01, ValueError),
           ("cheap", -0.1, 0.01, ValueError), ("cheap", math.nan, 0.01, ValueError),
           ("cheap", 0.5, -1.0, ValueError), ("cheap", "high", 0.01, TypeError)]
    for model, quality, cost, error in bad:
        with pytest.raises(error):
            router.update("stem/physics", model, quality, cost)
    assert router.state() == before


def test_constructor_validation():
    with pytest.raises(ValueError, match="repeated"):
        RegionalRouter(["a", "a"])
    with pytest.raises(ValueError, match="lam"):
        RegionalRouter(MODELS, lam=-1)
    with pytest.raises(ValueError, match="learner"):
        RegionalRouter(MODELS, learner="greedy")
    with pytest.raises(KeyError, match="unknown model"):
        FixedRouter(MODELS, "other")
    with pytest.raises(TypeError):
        RegionalRouter("ab")


def test_backoff_router_learns_the_best_model_per_region():
    """The fixed back-off explores every model in every region. (The tested sharing rules
    take the pool's verdict on a model a region has not tried: here the pool drops ``cheap``
    after three failures in ``hard/*``, so ``easy/*`` never learns it is best there; the
    regions that differ on the models the pool plays split, see test_regional.py.)"""
    outcomes = synthetic()
    router = RegionalRouter(MODELS, lam=0.3, sharing="backoff", seed=0)
    order = np.random.default_rng(1).permutation(outcomes.n_queries)
    picks: dict[str, list[str]] = {}
    for i in order:
        region = outcomes.regions[i]
        model = router.route(region)
        m = MODELS.index(model)
        router.update(region, model, outcomes.quality[i, m], outcomes.cost[i, m])
        picks.setdefault(region, []).append(model)
    # reward: easy: cheap 0.77 vs strong 0.55; hard: cheap 0.17 vs strong 0.55
    for region, chosen in picks.items():
        late = chosen[-100:]
        want = "cheap" if region.startswith("easy") else "strong"
        assert late.count(want) >= 90, (region, late.count(want))


def test_backoff_uses_parent_data_for_a_new_region():
    router = RegionalRouter(MODELS, lam=0.0, sharing="backoff", kappa=5.0)
    for _ in range(50):
        router.update("hard/r0", "cheap", 0.0, 0.1)
        router.update("hard/r0", "strong", 1.0, 1.0)
    rows = {(r["region"], r["model"]): r for r in router.estimates()}
    assert rows[("hard/r0", "strong")]["count"] == 50
    router.route("hard/r9")  # a region never seen: its estimate comes from its siblings
    rows = {(r["region"], r["model"]): r for r in router.estimates()}
    new = rows[("hard/r9", "strong")]
    assert new["count"] == 0 and new["effective_count"] == pytest.approx(5.0)
    assert new["estimate"] == pytest.approx(1.0)
    assert router.route("hard/r9") == "strong"


def test_state_round_trip_keeps_rankings():
    outcomes = synthetic(per_region=40)
    router = RegionalRouter(MODELS, lam=0.2)
    for i in range(outcomes.n_queries):
        model = router.route(outcomes.regions[i])
        m = MODELS.index(model)
        router.update(outcomes.regions[i], model, outcomes.quality[i, m], outcomes.cost[i, m])
    copy = RegionalRouter(MODELS, lam=0.2)
    copy.load_state(router.state())
    for region in ("easy/r0", "hard/r3", "other/new"):
        assert copy.ranking(region) == router.ranking(region)
    with pytest.raises(ValueError, match="lam"):
        RegionalRouter(MODELS, lam=0.5).load_state(router.state())


def test_references():
    outcomes = synthetic(per_region=50)
    oracle = CategoryOracle(outcomes, lam=0.3)
    assert oracle.route("easy/r1") == "cheap" and oracle.route("hard/r2") == "strong"
    query = QueryOracle(outcomes, lam=0.0)
    i = int(np.flatnonzero((outcomes.quality[:, 0] == 1) & (outcomes.quality[:, 1] == 1))[0])
    assert query.route("any", query=outcomes.query_ids[i]) == "cheap"  # tie -> cheaper
    with pytest.raises(KeyError, match="query id"):
        query.route("any")
    picks = {RandomRouter(MODELS, seed=5).route("x") for _ in range(1)}
    assert picks <= set(MODELS)
    a = [RandomRouter(MODELS, seed=5).route("x") for _ in range(3)]
    assert a == [RandomRouter(MODELS, seed=5).route("x") for _ in range(3)]


def test_hull_and_aiq_by_hand():
    c, q = nondecreasing_hull(np.array([0.0, 1.0, 2.0, 0.5, 3.0]),
                              np.array([0.5, 1.0, 0.9, 0.6, 0.95]))
    assert c.tolist() == [0.0, 1.0] and q.tolist() == [0.5, 1.0]
    assert aiq([0.0, 1.0], [0.5, 1.0], 0.0, 1.0) == pytest.approx(0.75)
    assert aiq([0.5, 1.0], [0.5, 1.0], 0.0, 1.0) == pytest.approx(0.375)  # 0 left of 0.5
    assert aiq([0.0, 1.0, 2.0], [0.5, 1.0, 0.2], 0.0, 2.0) == pytest.approx(0.875)
    with pytest.raises(ValueError, match="c_lo < c_hi"):
        aiq([0.0], [1.0], 1.0, 1.0)


def test_replay_regional_beats_flat_on_heterogeneous_regions():
    outcomes = synthetic()
    result = replay(outcomes, seeds=4, lambdas=[0.0, 0.1, 0.3, 0.6, 1.5])
    regional, _ = result.aiq("regional")
    flat, _ = result.aiq("flat")
    hull, _ = result.aiq("fixed-hull")
    oracle, _ = result.aiq("category-oracle")
    assert regional > flat + 0.03
    assert regional > hull + 0.03
    assert oracle >= regional
    assert result.near_oracle("regional")
    # regret against the per-category oracle: the regional learner's is far lower at lam=0.3
    r, f = result.index("regional"), result.index("flat")
    assert result.regret[r, 2].mean() < 0.5 * result.regret[f, 2].mean()


def test_replay_is_deterministic_per_seed_and_validates():
    outcomes = synthetic(per_region=30)
    a = replay(outcomes, seeds=[7], lambdas=[0.2])
    b = replay(outcomes, seeds=[7], lambdas=[0.2])
    c = replay(outcomes, seeds=[8], lambdas=[0.2])
    assert np.array_equal(a.quality, b.quality) and np.array_equal(a.regret, b.regret)
    t = a.index("thompson")
    assert not np.array_equal(a.regret[t], c.regret[t])
    with pytest.raises(KeyError, match="unknown router"):
        replay(outcomes, seeds=1, routers=["nope"])
    with pytest.raises(ValueError, match="lambdas"):
        replay(outcomes, seeds=1, lambdas=[-1.0])


def test_a_single_region_gives_regional_equal_to_flat():
    outcomes = synthetic(per_region=30)
    one = Outcomes("one", outcomes.query_ids, ("all",) * outcomes.n_queries, MODELS,
                   outcomes.quality, outcomes.cost)
    result = replay(one, seeds=2, lambdas=[0.0, 0.3], routers=["regional", "flat"])
    assert np.array_equal(result.quality[0], result.quality[1])


# -- warm start ----------------------------------------------------------------------------

def test_fit_equals_pushing_every_logged_outcome():
    """Without a cap, fitting a log is the same as updating the router with every model's
    outcome on every logged query (full information), node for node."""
    outcomes = synthetic(per_region=25)
    fitted = RegionalRouter(MODELS, lam=0.3)
    fitted.fit(outcomes, max_count=None)
    pushed = RegionalRouter(MODELS, lam=0.3)
    for i in range(outcomes.n_queries):
        for m, model in enumerate(MODELS):
            pushed.update(outcomes.regions[i], model, outcomes.quality[i, m],
                          outcomes.cost[i, m])
    a, b = fitted.state(), pushed.state()
    assert a["regions"] == b["regions"]
    assert np.allclose(a["stats"], b["stats"], rtol=1e-9, atol=1e-9)
    assert fitted.ranking("easy/r1")[0] == "cheap" and fitted.ranking("hard/r0")[0] == "strong"
    capped = RegionalRouter(MODELS, lam=0.3)
    capped.fit(outcomes, max_count=10)
    rows = {(r["region"], r["model"]): r["count"] for r in capped.estimates()}
    assert rows[("easy/r0", "cheap")] == 10 and rows[("/", "cheap")] == 80
    flat = FlatRouter(MODELS, lam=0.3)
    flat.fit(outcomes, max_count=None)
    assert np.allclose(flat.state()["stats"][0], b["stats"][0])
    with pytest.raises(KeyError, match="no outcomes for models"):
        RegionalRouter(("cheap", "other")).fit(outcomes)
    with pytest.raises(ValueError, match="max_count"):
        RegionalRouter(MODELS).fit(outcomes, max_count=0.0)


def _switches_after(max_count: float | None, *, log_size: int, steps: int, seed: int) -> bool:
    """Fit on a log where ``cheap`` is right in ``easy``, then the world changes (``cheap``
    always fails there): has the router moved to ``strong`` by the end of ``steps``?"""
    rng = np.random.default_rng(seed)
    n = log_size
    log = Outcomes("log", tuple(f"q{i}" for i in range(n)), ("easy",) * n, MODELS,
                   np.column_stack([rng.random(n) < 0.9, rng.random(n) < 0.85]).astype(float),
                   np.tile([0.1, 1.0], (n, 1)))
    router = RegionalRouter(MODELS, lam=0.3, seed=seed)
    router.fit(log, max_count=max_count)
    late = []
    for _ in range(steps):
        model = router.route("easy")
        quality = 0.0 if model == "cheap" else float(rng.random() < 0.85)
        router.update("easy", model, quality, 0.1 if model == "cheap" else 1.0)
        late.append(model)
    return late[-20:].count("strong") >= 18


def test_a_capped_prior_can_be_unlearned():
    """The log's weight is bounded: with ``max_count=50`` a 5,000-query log that has become
    wrong is overturned within 200 fresh outcomes in every seed; counted in full it is not."""
    assert all(_switches_after(50, log_size=5000, steps=200, seed=s) for s in range(5))
    assert not any(_switches_after(None, log_size=5000, steps=200, seed=s) for s in range(5))


def test_warm_replay_scores_on_the_rest_and_beats_a_cold_start():
    outcomes = synthetic()
    lambdas = [0.0, 0.1, 0.3, 0.6, 1.5]
    cold = replay(outcomes, seeds=4, lambdas=lambdas)
    again = replay(outcomes, seeds=4, lambdas=lambdas, train_fraction=None)
    assert np.array_equal(cold.quality, again.quality)  # no split: the cold start as before
    warm = replay(outcomes, seeds=4, lambdas=lambdas, train_fraction=0.5)
    n_test = outcomes.n_queries - outcomes.n_queries // 2
    assert warm.steps[-1] == n_test
    # the fixed models and oracles are scored on each seed's held-out half
    rest = np.random.default_rng([2, 0]).permutation(outcomes.n_queries)[-n_test:]
    fixed = warm.index("fixed:cheap")
    assert warm.quality[fixed, 0, 2] == pytest.approx(outcomes.quality[rest, 0].mean())
    hull = warm.aiq("fixed-hull")[0]
    for name in ("regional", "thompson"):  # the gap to the oracle at least halves
        assert warm.aiq("category-oracle")[0] - warm.aiq(name)[0] < \
            0.5 * (cold.aiq("category-oracle")[0] - cold.aiq(name)[0])
    assert warm.aiq("regional")[0] >= warm.aiq("category-oracle")[0] - 0.01
    assert warm.aiq("regional")[0] > hull + 0.03
    r = warm.index("regional")
    assert warm.regret[r].mean() < 0.25 * cold.regret[cold.index("regional")].mean()
    with pytest.raises(ValueError, match="train_fraction"):
        replay(outcomes, seeds=1, train_fraction=1.0)
