"""``canopy run STUDY``, ``canopy list`` and ``canopy reproduce``: parse, call the runner, render
with rich."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from canopy.reporting import output_folder, progress_lines

if TYPE_CHECKING:
    from canopy.experiments.runner import StudyRun
    from canopy.experiments.study import Headline, Study

__all__ = ["register"]

console = Console(stderr=True)

Quick = Annotated[bool, typer.Option("--quick", help="Smaller grid and fewer seeds.")]
Backend = Annotated[str, typer.Option(help="Where cells run: local processes or a Ray cluster.")]
Workers = Annotated[int | None, typer.Option(help="Worker processes (default: all cores).")]
Address = Annotated[str | None, typer.Option(help="Address of an existing Ray cluster.")]
Out = Annotated[Path, typer.Option(help="Output directory (one folder per study).",
                                   callback=output_folder)]


def _rate_column() -> Any:
    """A progress column showing cells per second (rich imported on use)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text("– cells/s" if speed is None else f"{speed:.2f} cells/s", style="cyan")

    return RateColumn()


def _parse_sets(values: list[str] | None) -> dict[str, str]:
    overrides = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = value.strip()
    return overrides


def _run_one(study: Study, *, quick: bool, seeds: int | None, overrides: dict[str, str],
             backend: str, workers: int | None, address: str | None, out: Path
             ) -> tuple[StudyRun, list[Headline]]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from canopy.experiments.outputs import StudyOutputs, write_study
    from canopy.experiments.runner import run_study

    with Progress(TextColumn(f"[bold]{study.name}"), BarColumn(), MofNCompleteColumn(),
                  _rate_column(), TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                  console=console, transient=False) as bar:
        task = bar.add_task(study.name, total=None)
        lines = None if console.is_terminal else progress_lines(study.name, Console(stderr=True))

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
            if lines is not None:  # a log or a pipe sees no bar until the end
                lines(done, total)

        result = run_study(study, store=StudyOutputs(out, study.name).cells, quick=quick,
                           seeds=seeds, overrides=overrides, backend=backend,  # type: ignore[arg-type]
                           workers=workers, address=address, progress=progress)
    if result.rejected:
        console.print(f"[yellow]recomputed {len(result.rejected)} stored cells that failed "
                      f"their check:[/yellow] {'; '.join(result.rejected)}")
    paths = write_study(study, result, out)
    headlines = study.headlines(result.rows)
    _print_headlines(study, result, headlines)
    console.print(f"wrote {paths.directory}/ (results.json, table.md, table.tex, figure.png)")
    return result, headlines


def _print_headlines(study: Study, result: StudyRun, headlines: list[Headline]) -> None:
    from rich.markup import escape

    from canopy.reporting import render

    rows = [[escape(h.label), f"{h.ours:.4g}",
             "–" if h.ci_low is None else escape(f"[{h.ci_low:.4g}, {h.ci_high:.4g}]"),
             "–" if h.paper is None else f"{h.paper:g}",
             "–" if h.ratio is None else f"{h.ratio:.3g}", escape(h.target or "–"),
             {True: "[green]yes[/green]", False: "[red]no[/red]", None: "–"}[h.passed]]
            for h in headlines]
    render(rows, ("headline", "ours", "95% CI", "paper", "ratio", "goal", "met"),
           title=f"{study.name}: {result.computed} cells computed, {result.reused} resumed, "
                 f"{result.seconds:.0f} s", console=console)


def _check_backend(backend: str, workers: int | None) -> None:
    if backend not in ("local", "ray"):
        raise ValueError(f"--backend must be 'local' or 'ray', got {backend!r}")
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")


def _fail(error: Exception) -> typer.Exit:
    console.print(f"[red]error:[/red] {error}")
    return typer.Exit(code=2)


def run_command(
    study: Annotated[str, typer.Argument(
        help="Study name (see `canopy list`), or your own as package.module:NAME.")],
    quick: Quick = False,
    seeds: Annotated[int | None, typer.Option(help="Seeds (default: the paper's).")] = None,
    backend: Backend = "local",
    workers: Workers = None,
    address: Address = None,
    out: Out = Path("results"),
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a study parameter, KEY=VALUE (repeatable).")] = None,
) -> None:
    """Run one study (resuming any cells already under OUT) and write its outputs."""
    from canopy.experiments.runner import load_study, plan

    try:
        chosen = load_study(study)
        overrides = _parse_sets(set_)
        plan(chosen, quick=quick, seeds=seeds, overrides=overrides)  # validate before work
        _check_backend(backend, workers)
    except (ValueError, TypeError) as error:
        raise _fail(error) from None
    _run_one(chosen, quick=quick, seeds=seeds, overrides=overrides, backend=backend,
             workers=workers, address=address, out=out)


def list_command() -> None:
    """List the studies of this build with their default seeds."""
    from rich.table import Table

    from canopy.experiments.studies import available, get_study

    table = Table(title="studies")
    for column in ("study", "seeds (paper)", "seeds (--quick)", "what it reproduces"):
        table.add_column(column)
    for name in available():
        study = get_study(name)
        table.add_row(name, str(study.seeds), str(study.quick_seeds), study.title)
    Console().print(table)


def reproduce_command(
    quick: Quick = False,
    backend: Backend = "local",
    workers: Workers = None,
    address: Address = None,
    out: Out = Path("results"),
    only: Annotated[list[str] | None, typer.Option(
        "--study", help="Run only these studies, by name or package.module:NAME "
                        "(repeatable; default: all but pyxab, which takes hours, and "
                        "mathsearch and mmlutrim, which need a live model server).")] = None,
) -> None:
    """Run every study and write OUT/report.md: each headline beside the paper's number."""
    from canopy.experiments.outputs import write_report
    from canopy.experiments.runner import load_study, plan
    from canopy.experiments.studies import ON_REQUEST, available

    try:
        default = [name for name in available() if name not in ON_REQUEST]
        studies = [load_study(name) for name in (only or default)]
        for study in studies:
            plan(study, quick=quick)
        _check_backend(backend, workers)
    except (ValueError, TypeError) as error:
        raise _fail(error) from None
    from canopy.cli import user_error

    entries, skipped = [], []
    for study in studies:
        try:
            result, headlines = _run_one(study, quick=quick, seeds=None, overrides={},
                                         backend=backend, workers=workers, address=address,
                                         out=out)
        except (FileNotFoundError, ModuleNotFoundError) as error:  # missing data or extra
            reason = user_error(error)
            if reason is None:
                raise
            console.print(f"[yellow]skipped {study.name}:[/yellow] {reason}")
            skipped.append((study.name, reason))
            continue
        entries.append((study, result, headlines))
    report = write_report(entries, out, quick=quick, skipped=skipped)
    console.print(f"wrote {report}" + (f" ({len(skipped)} studies skipped: "
                                       f"{', '.join(name for name, _ in skipped)})"
                                       if skipped else ""))


def register(app: typer.Typer) -> None:
    """Add ``run``, ``list`` and ``reproduce`` to the ``canopy`` app."""
    app.command("run")(run_command)
    app.command("list")(list_command)
    app.command("reproduce")(reproduce_command)
