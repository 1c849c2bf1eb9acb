"""Figures of a replay: cost-quality frontiers with every fixed model, and regret curves
(matplotlib, imported lazily)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from canopy.apps.routing.replay import ReplayResult

__all__ = ["plot_replay"]


def plot_replay(result: ReplayResult, path: str | Path, *, regret_lambda: float | None = None
                ) -> Path:
    """Write a two-panel figure: frontiers (left) and cumulative regret against the
    per-category oracle at ``regret_lambda`` (default: the middle of the sweep, right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    q, c = result.quality.mean(2), result.cost.mean(2)
    fixed = [i for i, r in enumerate(result.routers) if r.startswith("fixed:")]
    for i, name in enumerate(result.routers):
        if i in fixed:
            continue
        order = np.argsort(c[i])
        left.plot(c[i][order], q[i][order], marker="o", ms=3, label=name,
                  ls="--" if "oracle" in name else "-")
    if fixed:
        left.scatter(c[fixed, 0], q[fixed, 0], marker="s", color="black", zorder=3,
                     label="fixed models")
        for i in fixed:
            left.annotate(result.routers[i].removeprefix("fixed:"), (c[i, 0], q[i, 0]),
                          fontsize=6)
    left.set(xlabel="mean cost per query ($)", ylabel="mean quality",
             title=f"{result.dataset}: cost-quality frontier")
    left.legend(fontsize=7)
    if regret_lambda is None:
        li = result.lambdas.size // 2
    else:
        li = int(np.argmin(np.abs(result.lambdas - regret_lambda)))
    for i, name in enumerate(result.routers):
        if i not in fixed and "oracle" not in name:
            right.plot(result.steps, result.regret_curve[i, li], label=name)
    right.set(xlabel="queries", ylabel="cumulative regret vs per-category oracle",
              title=f"lambda = {result.lambdas[li]:.3g}")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
