"""Figures of a fleet sweep: TTFT CDF per policy (one panel per load) and the trade-off
Canopy's router chose over time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from canopy.apps.fleet.sim import Run

__all__ = ["plot_fleet"]


def plot_fleet(runs: dict[tuple[str, str, float], list[Run]], loads: Sequence[float],
               path: str | Path, *, title: str = "") -> Path:
    """TTFT CDFs (seed 0) per policy row at each load, and canopy's chosen ``theta``
    (moving average over 500 requests) at the highest load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(loads) + 1, figsize=(4.2 * (len(loads) + 1), 3.6))
    for ax, load in zip(axes, loads, strict=False):
        for (label, index, cell_load), cell in runs.items():
            if cell_load != load or "theta=" in label:
                continue
            ttft = np.sort(cell[0].ttft)
            name = label if label not in ("canopy",) else f"canopy ({index})"
            ax.plot(ttft, np.linspace(0, 1, ttft.size), label=name,
                    lw=2.0 if label == "canopy" else 1.0)
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (s)")
        ax.set_title(f"load {load:g}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    axes[0].legend(fontsize=7)
    ax = axes[-1]
    top = max(loads)
    for (label, index, cell_load), cell in runs.items():
        if label == "canopy" and cell_load == top:
            theta = cell[0].theta
            window = min(500, theta.size)
            smooth = np.convolve(theta, np.ones(window) / window, mode="valid")
            ax.plot(np.arange(smooth.size) + window, smooth, label=index)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("request")
    ax.set_ylabel("theta chosen (moving average)")
    ax.set_title(f"learnt trade-off, load {top:g}")
    ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
