"""``canopy cache replay``: replay a trace under eviction policies at several capacities."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register"]

cache_app = typer.Typer(no_args_is_help=True, help="Prefix-cache eviction: replay traces.")


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{what} must be positive integers, got {text!r}")
    return values


@cache_app.command("replay")
def replay_command(
    trace: str = typer.Option("conversation", help="conversation, synthetic, toolagent or a "
                              "file (Mooncake JSONL or a prompt log)"),
    capacity: str = typer.Option("16,64,256,1024,4096", help="capacities in blocks"),
    policies: str = typer.Option("lru,lfu,canopy,optimal", help="policies by name"),
    scenario: str = typer.Option("stationary", help="stationary or shift"),
    before: str | None = typer.Option(None, help="pre-shift workload (default: the trace "
                                      "itself in a disjoint block space)"),
    block_size: int = typer.Option(16, help="tokens a block for prompt logs"),
    ms_per_token: float = typer.Option(0.1, help="TTFT model: prefill ms per uncached token"),
    window: int = typer.Option(500, help="requests per point of the shift recovery curve"),
    seed: int = typer.Option(0, help="canopy: hash seed of the shadows' spatial sample"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    plot: Annotated[Path | None, typer.Option(help="write a figure (needs matplotlib)")] = None,
) -> None:
    """Blocks reused per request, hit ratio, TTFT saved and replay speed per policy/capacity."""
    from rich.console import Console
    from rich.table import Table

    from canopy.apps.cache.policies import make_policy
    from canopy.apps.cache.replay import recovery_curve, sweep
    from canopy.apps.cache.traces import resolve
    from canopy.apps.cache.ttft import TTFTModel

    capacities = _ints(capacity, "--capacity")
    if window < 1:
        raise typer.BadParameter(f"--window must be >= 1 request, got {window}")
    try:
        chosen = [make_policy(p, **({"seed": seed} if p == "canopy" else {}))
                  for p in (x.strip() for x in policies.split(",")) if p]
        ttft = TTFTModel(ms_per_token=ms_per_token)
        loaded = resolve(trace, block_size=block_size)
        pre = None if before is None else resolve(before, block_size=block_size)
    except (ValueError, FileNotFoundError) as error:
        raise typer.BadParameter(str(error)) from None
    if scenario not in ("stationary", "shift"):
        raise typer.BadParameter(f"--scenario must be stationary or shift, got {scenario!r}")
    results = sweep(loaded, policies=chosen, capacities=capacities, scenario_name=scenario,
                    before=pre, ttft=ttft)
    out: dict = {"trace": loaded.name, "scenario": scenario, "requests_counted":
                 len(results[0].reused), "results": {}}
    for r in results:
        entry = r.metrics()
        if scenario == "shift":
            entry["recovery"] = recovery_curve(r, window=window).round(4).tolist()
        out["results"].setdefault(r.policy, {})[str(r.capacity)] = entry
    if as_json:
        typer.echo(json.dumps(out))
    else:
        table = Table(title=f"{loaded.name}, {scenario}: blocks reused per request")
        table.add_column("capacity", justify="right")
        for p in chosen:
            table.add_column(p.name, justify="right")
        for c in capacities:
            cells = (out["results"][p.name][str(c)]["blocks_reused_per_request"] for p in chosen)
            table.add_row(str(c), *(f"{x:.3f}" for x in cells))
        Console().print(table)
    if plot is not None:
        _plot(out, capacities, window, plot)
        from canopy.plotting import announce_plot

        announce_plot(plot)


def _plot(out: dict, capacities: list[int], window: int, file: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shift = out["scenario"] == "shift"
    fig, axes = plt.subplots(1, 2 if shift else 1, figsize=(10 if shift else 5, 3.6),
                             squeeze=False)
    for name, per_cap in out["results"].items():
        axes[0][0].plot(capacities, [per_cap[str(c)]["blocks_reused_per_request"]
                                     for c in capacities], marker="o", label=name)
        if shift:
            curve = per_cap[str(capacities[-1])]["recovery"]
            axes[0][1].plot([(i + 1) * window for i in range(len(curve))], curve, label=name)
    axes[0][0].set(xscale="log", xlabel="capacity (blocks)", ylabel="blocks reused / request",
                   title=f"{out['trace']} ({out['scenario']})")
    axes[0][0].legend()
    if shift:
        axes[0][1].set(xlabel="requests after the shift", ylabel="blocks reused / request",
                       title=f"recovery at {capacities[-1]} blocks")
    fig.tight_layout()
    fig.savefig(file, dpi=120)
    plt.close(fig)


def register(app: typer.Typer) -> None:
    """Add the ``cache`` command group to the ``canopy`` app."""
    app.add_typer(cache_app, name="cache")
