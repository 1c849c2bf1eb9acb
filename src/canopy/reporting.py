"""Command-line helpers for the search and trim commands: shared options, rich tables, JSON
rows, progress bars and plots of accuracy against budget (matplotlib, imported lazily). Library
code returns rows; only these helpers, called from the CLI, write anything."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

__all__ = ["BaseUrl", "CacheDir", "Json", "Model", "Plot", "Seed", "Timeout", "cli_error",
           "interval_cells", "plot_accuracy", "print_json", "print_table", "progress_bar"]

BaseUrl = Annotated[str | None, typer.Option(
    "--base-url", help="OpenAI-compatible API root (e.g. http://127.0.0.1:8000/v1); default: "
    "start the local SmolLM2-135M llama-cpp server.")]
Model = Annotated[str | None, typer.Option("--model", help="Model name (needed with "
                                           "--base-url).")]
CacheDir = Annotated[Path | None, typer.Option(
    "--cache-dir", help="Response cache folder (a rerun costs no calls).")]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds allowed per call.")]
Seed = Annotated[int, typer.Option("--seed", help="Random seed.")]
Json = Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")]
Reference = Annotated[str, typer.Option("--reference", help="Method the paired gaps are "
                                          "taken against.")]


def output_path(path: Path | str | None) -> Path | str | None:
    """Typer callback of an output file option (``--plot``, ``--log``, ...): its folder must
    exist and be writable, checked while the options are parsed, before any work starts."""
    if path is None:
        return None
    target = Path(path)
    if target.is_dir():
        raise typer.BadParameter(f"{target} is a folder, not a file")
    folder = target.parent
    if not folder.is_dir():
        raise typer.BadParameter(f"the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (target.exists() and
                                                     not os.access(target, os.W_OK)):
        raise typer.BadParameter(f"cannot write {target}")
    return path


def output_folder(path: Path | None) -> Path | None:
    """Typer callback of an output folder option (``--out``): an existing folder, or one
    that can be made under the nearest existing folder above it, which must be writable."""
    if path is None:
        return None
    target = Path(path).absolute()
    if target.exists() and not target.is_dir():
        raise typer.BadParameter(f"{path} is a file, not a folder")
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise typer.BadParameter(f"cannot write in {existing}")
    return path


Plot = Annotated[Path | None, typer.Option("--plot", help="Save a plot of accuracy to this "
                                           "image.", callback=output_path)]

Row = Mapping[str, object]


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def cli_error(error: Exception) -> typer.Exit:
    """Print ``error`` on stderr and return the exit (status 2) for the CLI to raise."""
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {error}")
    return typer.Exit(2)


def interval_cells(row: Row) -> dict[str, object]:
    """``row`` with ``accuracy [ci_low, ci_high]`` and ``delta [low, high]`` joined into the
    display columns ``accuracy [95% CI]`` and ``delta [95% CI]``."""
    out = dict(row)
    out["accuracy [95% CI]"] = (f"{row['accuracy']:.3f} [{row['ci_low']:.3f}, "
                                f"{row['ci_high']:.3f}]")
    if row.get("delta") is not None:
        out["delta [95% CI]"] = (f"{row['delta']:+.3f} [{row['delta_ci_low']:+.3f}, "
                                 f"{row['delta_ci_high']:+.3f}]")
    return out


def print_table(rows: Sequence[Row], columns: Sequence[str], *, title: str,
                console: Console | None = None) -> None:
    """One row per entry of ``rows``, the given ``columns`` in order (see :func:`render`)."""
    render([[_cell(row.get(column)) for column in columns] for row in rows], columns,
           title=title, console=console,
           justify=["left" if column == "method" else "right" for column in columns])


def render(cells: Sequence[Sequence[str]], columns: Sequence[str], *, title: str,
           console: Console | None = None, justify: Sequence[str] | None = None) -> None:
    """A table of rich-markup ``cells`` that is never cut: whole in a pipe or a file (as wide
    as it needs), a table on a terminal wide enough for it, and otherwise one block per row
    (its first cell, then ``column: value`` pairs that wrap at the terminal's width)."""
    console = console or Console()
    widths = [max([Text.from_markup(column).cell_len,
                   *(Text.from_markup(row[i]).cell_len for row in cells)])
              for i, column in enumerate(columns)]
    natural = sum(widths) + 3 * len(columns) + 1
    if not console.is_terminal:
        console = Console(file=console.file, width=max(natural, len(title), 80))
    if natural <= console.width:
        table = Table(title=title)
        for i, column in enumerate(columns):
            table.add_column(column, no_wrap=True,
                             justify=(justify[i] if justify else "left"))  # type: ignore[arg-type]
        for row in cells:
            table.add_row(*row)
        console.print(table)
        return
    console.print(Text(title, style="bold"))
    for row in cells:
        block = Text()
        block.append_text(Text.from_markup(row[0], style="bold"))
        block.append("\n  ")
        block.append_text(Text.from_markup("; ".join(
            f"{column}: {value}" for column, value in zip(columns[1:], row[1:], strict=True))))
        console.print(block)


def print_json(payload: object) -> None:
    typer.echo(json.dumps(payload, indent=2))


@contextmanager
def progress_bar(description: str, total: int, *,
                 enabled: bool = True) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr; yields ``update(done, total)``. When stderr is not a
    terminal (a log, a pipe, CI), a line ``description: done/total`` at most every
    ``PROGRESS_EVERY_S`` seconds and at the end instead, so long work is never silent."""
    if not enabled:
        yield lambda done, total: None
        return
    console = Console(stderr=True)
    if not console.is_terminal:
        yield progress_lines(description, console)
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda done, total: bar.update(task, completed=done, total=total)


#: Seconds between two progress lines when stderr is not a terminal.
PROGRESS_EVERY_S = 10.0


def progress_lines(description: str, console: Console) -> Callable[[int, int], None]:
    """``update(done, total)`` printing ``description: done/total, N s`` lines once work is
    done, at most one every :data:`PROGRESS_EVERY_S` seconds, and the last one always."""
    start = time.monotonic()
    last = [-math.inf]

    def update(done: int, total: int) -> None:
        now = time.monotonic()
        if done > 0 and (now - last[0] >= PROGRESS_EVERY_S or done >= total):
            last[0] = now
            console.print(f"{description}: {done}/{total}, {now - start:.0f} s",
                          highlight=False, markup=False, soft_wrap=True)
    return update


def plot_accuracy(rows: Sequence[Row], path: str | Path, *, x: str, title: str,
                  xlabel: str) -> Path:
    """Accuracy (with its interval band) against ``x`` for every method, saved to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from canopy.plotting import distinct_series

    figure, axes = plt.subplots(figsize=(6, 4))
    methods = list(dict.fromkeys(str(row["method"]) for row in rows))
    palette = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")
    series = [sorted((row for row in rows if row["method"] == method),
                     key=lambda row: float(row[x]))  # type: ignore[arg-type]
              for method in methods]
    accuracy = [[float(row["accuracy"]) for row in mine] for mine in series]  # type: ignore[arg-type]
    positions = [[float(row[x]) for row in mine] for mine in series]  # type: ignore[arg-type]
    styles = distinct_series(methods, accuracy, positions)
    span = max(max(p) for p in positions) - min(min(p) for p in positions) or 1.0
    for i, (mine, ys, style) in enumerate(zip(series, accuracy, styles, strict=True)):
        xs = style.along([float(row[x]) for row in mine], span)  # type: ignore[arg-type]
        line = axes.plot(xs, ys, color=palette(i % palette.N), label=style.label,
                         **style.kwargs)[0]
        if all("ci_low" in row for row in mine):
            axes.fill_between(xs, [float(r["ci_low"]) for r in mine],  # type: ignore[arg-type]
                              [float(r["ci_high"]) for r in mine],  # type: ignore[arg-type]
                              color=line.get_color(), alpha=0.15)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("accuracy")
    axes.set_title(title)
    axes.legend(fontsize=8)
    figure.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=120)
    plt.close(figure)
    return target
