"""Figures of a replay: cost-quality frontiers with every fixed model, and regret curves
(matplotlib, imported lazily)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from canopy.apps.routing.replay import ReplayResult
from canopy.plotting import distinct_series

__all__ = ["plot_replay"]


def plot_replay(result: ReplayResult, path: str | Path, *, regret_lambda: float | None = None
                ) -> Path:
    """Write a two-panel figure: frontiers (left) and cumulative regret against the
    per-category oracle at ``regret_lambda`` (default: the middle of the sweep, right).
    Every router has its own marker and dashes; one identical to another is offset and
    labelled "(= other)"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    q, c = result.quality.mean(2), result.cost.mean(2)
    fixed = [i for i, r in enumerate(result.routers) if r.startswith("fixed:")]
    learned = [i for i in range(len(result.routers)) if i not in fixed]
    styles = distinct_series([result.routers[i] for i in learned],
                             [np.concatenate([c[i], q[i]]) for i in learned])
    for i, style in zip(learned, styles, strict=True):
        order = np.argsort(c[i])
        left.plot(c[i][order] * style.shift, q[i][order], label=style.label, **style.kwargs)
    if fixed:
        left.scatter(c[fixed, 0], q[fixed, 0], marker="s", color="black", zorder=3,
                     label="fixed models")
        middle = float(np.median(c[fixed, 0]))
        for i in fixed:  # labels point inwards, so none is cut at the figure's edge
            inward = "right" if c[i, 0] > middle else "left"
            left.annotate(result.routers[i].removeprefix("fixed:"), (c[i, 0], q[i, 0]),
                          xytext=(-4 if inward == "right" else 4, 4),
                          textcoords="offset points", ha=inward, fontsize=6)
    left.set(xlabel="mean cost per query ($)", ylabel="mean quality",
             title=f"{result.dataset}: cost-quality frontier")
    left.legend(fontsize=7)
    if regret_lambda is None:
        li = result.lambdas.size // 2
    else:
        li = int(np.argmin(np.abs(result.lambdas - regret_lambda)))
    curves = [i for i in learned if "oracle" not in result.routers[i]]
    styles = distinct_series([result.routers[i] for i in curves],
                             [result.regret_curve[i, li] for i in curves])
    for i, style in zip(curves, styles, strict=True):
        right.plot(result.steps * style.shift, result.regret_curve[i, li], label=style.label,
                   markevery=max(len(result.steps) // 10, 1), **style.kwargs)
    right.set(xlabel="queries", ylabel="cumulative regret vs per-category oracle",
              title=f"lambda = {result.lambdas[li]:.3g}")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
