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
