"""``canopy demo``, ``canopy bench`` and ``canopy theory check``."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
from rich.table import Table

from canopy.reporting import output_path, progress_lines


def demo(
    seeds: int = typer.Option(6, min=1, help="Seeds (fresh instance per seed)."),
    budgets: str = typer.Option("300,750,1500", help="Comma-separated cost budgets."),
    plot: Path = typer.Option(Path("canopy-demo.png"), help="Where to write the PNG plot.",
                              callback=output_path),
) -> None:
    """Top-5 identification on a 1,024-leaf piecewise-smooth tree: Canopy (beam, sound)
    against successive elimination and uniform allocation."""
    from canopy.demo import plot_demo, run_demo

    console = Console()
    try:
        budget_values = tuple(float(b) for b in budgets.split(","))
    except ValueError:
        raise typer.BadParameter(f"budgets must be comma-separated numbers, got {budgets!r}"
                                 ) from None
    total = seeds * len(budget_values) * 4
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task("runs", total=total)
        lines = None if console.is_terminal else progress_lines("demo runs", Console(stderr=True))

        def advance() -> None:
            bar.advance(task)
            if lines is not None:  # a log or a pipe sees no bar until the end
                lines(int(bar.tasks[0].completed), total)

        rows = run_demo(budgets=budget_values, seeds=seeds, progress=advance)
    table = Table(title=f"recall@5, mean and [95% CI] over {seeds} seeds")
    table.add_column("method", no_wrap=True)
    for budget in budget_values:
        table.add_column(f"B={budget:g}", justify="right", no_wrap=True)
    for method in dict.fromkeys(row.method for row in rows):
        cells = {row.budget: row for row in rows if row.method == method}
        # mean above its interval: the table fits 80 columns for up to four budgets
        table.add_row(method, *(f"{cells[b].recall:.3f}\n[{cells[b].ci_low:.2f}, "
                                f"{cells[b].ci_high:.2f}]" for b in budget_values))
    console.print(table)
    try:
        plot_demo(rows, str(plot))
        console.print(f"plot written to {plot.resolve()}")
    except ImportError:
        console.print("matplotlib is not installed (pip install 'canopy-bandits[plots]'): "
                      "no plot written")


def bench(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Per-round overhead of the descent and identification policies, and certificate
    throughput."""
    from canopy.bench import run_benchmarks

    console = Console(stderr=True)
    if console.is_terminal:
        with console.status("benchmarking") as status:
            figures = run_benchmarks(progress=lambda key: status.update(f"benchmarking {key}"))
    else:  # a log or a pipe: one line per measurement, so minutes of work are not silent
        figures = run_benchmarks(progress=lambda key: console.print(
            f"benchmarking {key}", highlight=False, markup=False))
    if as_json:
        print(json.dumps(figures))
        return
    table = Table(title="canopy bench")
    table.add_column("measurement")
    table.add_column("value", justify="right")
    for key, value in figures.items():
        if isinstance(value, dict):
            for inner, number in value.items():
                table.add_row(f"{key}/{inner}", f"{number:,.0f}")
        elif isinstance(value, float):
            table.add_row(key, f"{value:.2f} us")
    Console().print(table)


def theory_check(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    instances: int = typer.Option(20_000, min=0, help="Random exact instances in all."),
    seed: int = typer.Option(0, help="Seed of the random instances."),
) -> None:
    """Check the theorems' algebra symbolically (sympy) and their inequalities on random exact
    instances (fractions); exit 1 if any check fails."""
    from rich.markup import escape

    from canopy.theory import NOT_CHECKED, check_all

    results = check_all(instances=instances, seed=seed)
    failed = not all(result.ok for result in results)
    if as_json:
        print(json.dumps({"theorems": [r.as_dict() for r in results],
                          "instances": sum(r.instances for r in results),
                          "failures": sum(r.failures for r in results),
                          "not_checked": NOT_CHECKED}))
    else:
        console = Console()
        for result in results:
            console.print(f"[bold]{result.theorem}[/bold]")
            for identity, verified in result.symbolic.items():
                console.print(f"  {'[green]ok' if verified else '[red]FAILED'}[/] symbolic: "
                              f"{escape(identity)}")
            console.print(f"  {result.instances:,} exact instances, {result.failures} failures: "
                          + "; ".join(result.checked))
        total = sum(r.instances for r in results)
        console.print(f"{total:,} instances, {sum(r.failures for r in results)} failures. "
                      f"Not checked (cited): {NOT_CHECKED}.")
    if failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(demo)
    app.command()(bench)
    theory = typer.Typer(help="The paper's theorems: symbolic and exact-instance checks.",
                         no_args_is_help=True)
    theory.command("check")(theory_check)
    app.add_typer(theory, name="theory")
