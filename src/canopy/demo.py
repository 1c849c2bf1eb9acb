"""The embedded default job behind ``canopy demo``: top-5 identification on a 1,024-leaf
piecewise-smooth tree (branching 4, depth 5, noise 0.1, five planted discontinuities, so the
top 5 are the five spikes hidden in innocuous cells; probe cost 0.05 of a leaf evaluation),
Canopy's beam (detect-and-relax: flagged cells get leaf certification) and sound variants
against successive elimination and uniform allocation, over a few budgets and seeds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from canopy.instances import piecewise_lipschitz
from canopy.metrics import recall_at_k
from canopy.run import run

__all__ = ["DemoRow", "plot_demo", "run_demo"]


def _methods() -> dict[str, Callable[[], object]]:
    from canopy.policies import SuccessiveElimination, TopKBeam, TopKSound, Uniform

    return {
        "canopy-beam": lambda: TopKBeam(k=5, spread="hybrid"),
        "canopy-sound": lambda: TopKSound(k=5),
        "successive-elimination": SuccessiveElimination,
        "uniform": Uniform,
    }


@dataclass(frozen=True)
class DemoRow:
    """Mean recall@5 of one method at one budget, with a 95% t-interval over seeds."""

    method: str
    budget: float
    recall: float
    ci_low: float
    ci_high: float
    n: int


def run_demo(*, budgets: Sequence[float] = (300.0, 750.0, 1500.0), seeds: int = 6,
             k: int = 5, progress: Callable[[], None] | None = None) -> list[DemoRow]:
    """Recall@k of every method at every budget over ``seeds`` seeds (instance seed = run
    seed, so each seed is a fresh tree). ``progress()`` is called after every run."""
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    methods = _methods()
    recalls: dict[tuple[str, float], list[float]] = {}
    for seed in range(seeds):
        planted = piecewise_lipschitz(4, 5, 5, probe_cost=0.05, leaf_cost=1.0, sigma=0.1,
                                      seed=seed)
        truth = planted.problem.top_k(k)
        for budget in budgets:
            for name, make in methods.items():
                result = run(make(), planted.problem, budget=budget, seed=seed, k=k)
                recalls.setdefault((name, budget), []).append(
                    recall_at_k(result.recommendation, truth))
                if progress is not None:
                    progress()
    return [_summarise(name, budget, values) for (name, budget), values in recalls.items()]


def _summarise(method: str, budget: float, values: list[float]) -> DemoRow:
    from canopy.stats import t_interval

    mean, low, high = t_interval(values, bounds=(0.0, 1.0))  # recall lives in [0, 1]
    return DemoRow(method, float(budget), mean, mean if low is None else low,
                   mean if high is None else high, len(values))


def plot_demo(rows: Sequence[DemoRow], path: str) -> None:
    """Recall against budget with 95% bands, one line per method, saved as a PNG. Every
    series has its own marker and line style, and a series identical to an earlier one is
    drawn slightly offset with "(= other)" in its legend entry, so none hides another."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from canopy.plotting import distinct_series

    fig, ax = plt.subplots(figsize=(7, 4.2))
    methods = list(dict.fromkeys(row.method for row in rows))
    series = [sorted((r for r in rows if r.method == m), key=lambda r: r.budget)
              for m in methods]
    styles = distinct_series(methods, [[r.recall for r in mine] for mine in series])
    for mine, style in zip(series, styles, strict=True):
        x = [r.budget * style.shift for r in mine]  # multiplicative: budgets span decades
        ax.plot(x, [r.recall for r in mine], label=style.label, **style.kwargs)
        ax.fill_between(x, [r.ci_low for r in mine], [r.ci_high for r in mine], alpha=0.15)
    ax.set_xlabel("budget (leaf-evaluation units)")
    ax.set_ylabel("recall@5 (mean, 95% CI)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Top-5 on a 1,024-leaf piecewise-smooth tree (probe cost 0.05)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
