"""``canopy topk``: top-k identification over a user's CSV of candidates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from canopy.apps.topk.hardness import top_k_complexity
from canopy.apps.topk.pools import read_pool_csv
from canopy.apps.topk.problem import PoolProblem
from canopy.apps.topk.select import METHODS, Selection, select_top_k
from canopy.apps.topk.trees import PoolTree, tree_from_families, tree_from_features

__all__ = ["register", "topk"]


def _columns(text: str | None) -> list[str] | None:
    if text is None:
        return None
    columns = [part.strip() for part in text.split(",") if part.strip()]
    if not columns:
        raise ValueError(f"no column names in {text!r}")
    return columns


def topk(
    pool: Annotated[Path, typer.Option("--pool", help="CSV of candidates: one row each, a "
                                       "name column, score columns in [0, 1] or percent "
                                       "(detected per column).")],
    target: Annotated[str, typer.Option("--target", help="Score column to rank by.")],
    budget: Annotated[float, typer.Option("--budget", help="Cost budget, in leaf "
                                          "evaluations.")],
    k: Annotated[int, typer.Option("--k", help="How many to choose.")] = 10,
    tree_from: Annotated[str | None, typer.Option(
        "--tree-from", help="Comma-separated score columns to cluster into the tree "
        "(default: every other numeric column).")] = None,
    families: Annotated[str | None, typer.Option(
        "--families", help="Comma-separated hierarchy columns, outermost first "
        "(e.g. family,model).")] = None,
    branching: Annotated[int, typer.Option("--branching", help="Tree branching "
                                           "(clustering).")] = 10,
    depth: Annotated[int, typer.Option("--depth", help="Tree depth (clustering).")] = 3,
    method: Annotated[str, typer.Option("--method", help=" | ".join(METHODS))] = "canopy",
    probe_cost: Annotated[float, typer.Option("--probe-cost", help="Cost of a probe, in leaf "
                                              "evaluations.")] = 0.05,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    name_column: Annotated[str | None, typer.Option(
        "--name-column", help="Column of candidate names (default: the first).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the choice as JSON.")] = False,
) -> None:
    """Choose the top K candidates of a CSV under a cost budget: each leaf evaluation draws a
    Bernoulli outcome with the candidate's TARGET score; a probe evaluates a random candidate
    of a group of similar ones."""
    console = Console(stderr=True)
    try:
        if tree_from is not None and families is not None:
            raise ValueError("give --tree-from or --families, not both")
        if method not in METHODS:
            raise ValueError(f"unknown --method {method!r}; known: {', '.join(METHODS)}")
        group_columns = _columns(families) or []
        table = read_pool_csv(pool, target=target, name_column=name_column,
                              feature_columns=_columns(tree_from), group_columns=group_columns)
        pool_tree: PoolTree = (tree_from_families(table, group_columns) if group_columns else
                               tree_from_features(table, branching=branching, depth=depth,
                                                  seed=seed))
        problem = PoolProblem(table, pool_tree, probe_cost=probe_cost, outcomes="bernoulli")
        selection = select_top_k(problem, k=k, budget=budget, method=method, seed=seed)
    except (ValueError, TypeError) as error:
        console.print(f"[red]error:[/red] {error}", soft_wrap=True, markup=True,
                      highlight=False)
        raise typer.Exit(2) from None
    if table.left_out:
        console.print(f"left out of the tree (they contain {target}): "
                      f"{', '.join(table.left_out)}; name the tree's columns with --tree-from",
                      soft_wrap=True, markup=False, highlight=False)
    hardness = top_k_complexity(table.target, k) if k < table.size else float("nan")
    if as_json:
        typer.echo(json.dumps({**_as_dict(selection, k, pool_tree),
                               "left_out": list(table.left_out), "complexity": hardness}))
    else:
        _render(selection, table.target, Console(), pool_tree, target)
        Console().print(f"the picks' mean {target} is {selection.captured:.0%} of the way from "
                        f"the pool's mean to the true top {k}'s; a structure-blind method "
                        f"needs about {hardness:,.3g} evaluations for a high recall here (the "
                        f"top-{k} complexity H)", soft_wrap=True, highlight=False)


def _as_dict(selection: Selection, k: int, pool_tree: PoolTree) -> dict[str, object]:
    return {"names": list(selection.names), "method": selection.method, "k": k,
            "budget": selection.budget, "spent": selection.spent,
            "n_probes": selection.n_probes, "n_leaf_evals": selection.n_leaf_evals,
            "recall": selection.recall, "captured": selection.captured,
            "tree": pool_tree.description}


def _render(selection: Selection, scores: object, console: Console, pool_tree: PoolTree,
            target: str) -> None:
    table = Table(title=f"top {len(selection.names)} by {target} ({selection.method})")
    table.add_column("rank", justify="right")
    table.add_column("candidate")
    table.add_column(f"{target} (table)", justify="right")
    for rank, (name, row) in enumerate(zip(selection.names, selection.rows, strict=True), start=1):
        table.add_row(str(rank), name, f"{scores[row]:.3f}")  # type: ignore[index]
    console.print(table)
    console.print(f"tree: {pool_tree.description} ({pool_tree.tree.n_leaves} leaves, "
                  f"{pool_tree.n_deeper} below the requested depth)")
    console.print(f"spent {selection.spent:g} of {selection.budget:g}: "
                  f"{selection.n_probes} probes, {selection.n_leaf_evals} leaf evaluations; "
                  f"recall@{len(selection.names)} against the table: {selection.recall:.2f}")


def register(app: typer.Typer) -> None:
    """Add the top-level ``topk`` command."""
    app.command("topk")(topk)
