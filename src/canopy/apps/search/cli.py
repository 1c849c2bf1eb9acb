"""``canopy search replay`` (logged MATH answers) and ``canopy search run`` (live GSM8K search
against an OpenAI-compatible endpoint)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from canopy.apps.search.report import (
    interval_cells,
    plot_accuracy,
    print_json,
    print_table,
    progress_bar,
)

__all__ = ["register", "search_app"]

search_app = typer.Typer(no_args_is_help=True, add_completion=False,
                         help="Test-time search: value-guided search against best-of-N.")

_REPLAY_FILES = {"qwen25math_rm": "math_cot_100.jsonl"}
_COLUMNS = ["method", "budget", "accuracy [95% CI]", "delta [95% CI]", "calls",
            "reward_calls", "tokens"]


def parse_budgets(text: str) -> list[float]:
    """``"2,4,8"`` -> ``[2.0, 4.0, 8.0]``; each must be a number of calls >= 1."""
    try:
        budgets = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--budgets must be comma-separated numbers, got {text!r}") from None
    if not budgets or any(b < 1 for b in budgets):
        raise ValueError(f"--budgets must list numbers of calls >= 1, got {text!r}")
    return budgets


def _fail(error: Exception) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/red] {error}")
    return typer.Exit(2)


@search_app.command("replay")
def replay_command(
    dataset: Annotated[str, typer.Option("--dataset", help="Logged data set.")] = "qwen25math_rm",
    budgets: Annotated[str, typer.Option("--budgets", help="Comma-separated budgets, in "
                                         "model calls per problem.")] = "1,2,4,8,16",
    rm_cost: Annotated[float, typer.Option("--rm-cost", help="Calls charged for one "
                                           "reward-model score.")] = 1.0,
    orders: Annotated[int, typer.Option("--orders", help="Random generation orders per "
                                        "problem.")] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    reference: Annotated[str, typer.Option("--reference", help="Method the paired gaps are "
                                           "taken against.")] = "best_of_n",
    as_json: Annotated[bool, typer.Option("--json", help="Print rows as JSON.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Save accuracy against budget "
                                              "to this image.")] = None,
) -> None:
    """Replay best-of-N, majority, reward-weighted vote and the multi-fidelity selector on
    logged answers at matched budgets, with paired bootstrap intervals over problems."""
    from canopy import data
    from canopy.apps.search.replay import load_logged, replay

    try:
        if dataset not in _REPLAY_FILES:
            raise ValueError(f"unknown --dataset {dataset!r}; known: {', '.join(_REPLAY_FILES)}")
        problems = load_logged(data.path(dataset, _REPLAY_FILES[dataset]))
        with progress_bar("replay", len(problems), enabled=not as_json) as update:
            result = replay(problems, budgets=parse_budgets(budgets), rm_cost=rm_cost,
                            n_orders=orders, seed=seed, progress=update)
        rows = [row.as_dict() for row in result.rows(reference=reference, seed=seed)]
    except (ValueError, FileNotFoundError) as error:
        raise _fail(error) from None
    if plot is not None:
        plot_accuracy(rows, plot, x="calls", title=f"{dataset}: accuracy vs calls",
                      xlabel="model calls per problem (mean spent)")
    if as_json:
        print_json({"dataset": dataset, "rm_cost": rm_cost, "orders": orders, "rows": rows})
    else:
        print_table([interval_cells(row) for row in rows], _COLUMNS,
                    title=f"{dataset}: {len(problems)} problems, reward call = {rm_cost:g} "
                    f"calls, delta against {reference}")


def register(app: typer.Typer) -> None:
    """Add the ``search`` command group."""
    app.add_typer(search_app, name="search")
