"""A study's outputs: ``results.json``, ``table.md``, ``table.tex``, ``figure.png`` (95% bands),
and the ``report.md`` of ``canopy reproduce`` (each headline beside the paper's number)."""

from __future__ import annotations

import json
import math
import os
import textwrap
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from canopy.errors import MissingExtra
from canopy.experiments.runner import StudyRun
from canopy.experiments.study import Headline, Panel, PaperValue, Row, Study

__all__ = ["StudyOutputs", "write_report", "write_study"]


class StudyOutputs:
    """Paths of one study's output files under ``out/<study>/``."""

    def __init__(self, out: str | os.PathLike, study: str) -> None:
        self.directory = Path(out) / study
        self.results = self.directory / "results.json"
        self.table_md = self.directory / "table.md"
        self.table_tex = self.directory / "table.tex"
        self.figure = self.directory / "figure.png"
        self.cells = self.directory / "cells"


def _paper_value(paper: Sequence[PaperValue], row: Row) -> float | None:
    for value in paper:
        if value.method == row.method and value.metric == row.metric and (
                value.x == row.x or (value.x is not None and row.x is not None
                                     and math.isclose(value.x, row.x))):
            return value.value
    return None


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.3g}"
    return f"{value:.4g}" if abs(value) < 100 else f"{value:,.0f}"


def _ci(low: float | None, high: float | None) -> str:
    return "–" if low is None or high is None else f"[{_fmt(low)}, {_fmt(high)}]"


def _label(row: Row) -> str:
    """A row's method, with its objective where the study has several."""
    return row.method if row.objective is None else f"{row.method} on {row.objective}"


def _table_rows(study: Study, rows: Sequence[Row]) -> list[list[str]]:
    return [[_label(r), r.x_name, _fmt(r.x), r.metric, _fmt(r.mean), _ci(r.ci_low, r.ci_high),
             str(r.n), _fmt(_paper_value(study.paper, r))] for r in rows]


_HEADER = ["method", "x", "x value", "metric", "mean", "95% CI", "n", "paper"]


def _cell(text: str) -> str:
    """A markdown table cell: ``|`` escaped, newlines folded."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _markdown(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(map(_cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(_cell, cells)) + " |" for cells in body]
    return "\n".join(lines) + "\n"


def _latex_escape(text: str) -> str:
    for char, escaped in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"),
                          ("_", r"\_"), ("#", r"\#"), ("$", r"\$"), ("–", "--")):
        text = text.replace(char, escaped)
    return text


def _latex(study: Study, body: Sequence[Sequence[str]]) -> str:
    lines = [r"\begin{tabular}{llrlrlrr}", r"\toprule",
             " & ".join(_HEADER).replace("%", r"\%") + r" \\", r"\midrule"]
    lines += [" & ".join(_latex_escape(c) for c in cells) + r" \\" for cells in body]
    lines += [r"\bottomrule", r"\end{tabular}",
              f"% {study.name}: {_latex_escape(study.title)}; paper values from the study's "
              "PAPER constant"]
    return "\n".join(lines) + "\n"


def write_study(study: Study, result: StudyRun, out: str | os.PathLike) -> StudyOutputs:
    """Write ``results.json``, ``table.md``, ``table.tex`` and ``figure.png`` of one study."""
    paths = StudyOutputs(out, study.name)
    paths.directory.mkdir(parents=True, exist_ok=True)
    headlines = study.headlines(result.rows)
    document = {
        "study": study.name,
        "config": result.config(),
        "rows": [asdict(r) for r in result.rows],
        "paper": [asdict(p) for p in study.paper],
        "headlines": [dict(asdict(h), ratio=h.ratio) for h in headlines],
    }
    paths.results.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")
    body = _table_rows(study, result.rows)
    paths.table_md.write_text(f"# {study.name}: {study.title}\n\n"
                              f"{result.seeds} seeds; 95% t-intervals over seeds.\n\n"
                              + _markdown(_HEADER, body))
    paths.table_tex.write_text(_latex(study, body))
    _figure(study, result.rows, paths.figure)
    return paths


def _default_panels(rows: Sequence[Row]) -> tuple[Panel, ...]:
    seen = dict.fromkeys((r.metric, r.x_name) for r in rows)
    return tuple(Panel(metric=metric, x_name=x_name) for metric, x_name in seen)


def _figure(study: Study, rows: Sequence[Row], path: Path) -> None:
    try:
        import matplotlib
    except ImportError as error:  # pragma: no cover - depends on the installed extras
        raise MissingExtra("figure.png needs matplotlib: pip install 'canopy-bandits[plots]' "
                           "(the cells are stored; rerun to write the outputs)") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = study.panels or _default_panels(rows)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(7.0, 5.2 * len(panels)), 4.2),
                             squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel.kind == "pair":
            _pair_panel(ax, panel, rows)
        else:
            _curve_panel(ax, panel, rows)
        ax.set_title(panel.title or f"{panel.metric} vs {panel.x_metric or panel.x_name}")
        ax.set_ylabel(panel.metric)
        if panel.log_x:
            ax.set_xscale("log")
        if panel.log_y:
            ax.set_yscale("log")
        if panel.diagonal:
            low, high = ax.get_xlim()
            ax.plot([low, high], [low, high], color="grey", linestyle=":", label="y = x")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a panel with no rows of this run stays bare
            ax.legend(fontsize=8)
    width = fig.get_size_inches()[0]
    fig.suptitle(textwrap.fill(f"{study.name}: {study.title}", int(width * 13)), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _methods(panel: Panel, rows: Sequence[Row]) -> list[str]:
    """The curves' labels (:func:`_label`): the panel's methods in its order, else all."""
    present: dict[str, dict[str, None]] = {}
    for r in rows:
        present.setdefault(r.method, {})[_label(r)] = None
    return [label for m in (panel.methods or present) if m in present for label in present[m]]


def _curve_panel(ax, panel: Panel, rows: Sequence[Row]) -> None:
    """Curves over x with 95% bands; every curve has its own marker and dashes, and one
    identical to another is offset and labelled "(= other)" (:mod:`canopy.plotting`)."""
    from canopy.plotting import distinct_series

    rows = [r for r in rows if r.metric == panel.metric and r.x_name == panel.x_name]
    xs = sorted({r.x for r in rows if r.x is not None})
    curves = []
    for index, method in enumerate(_methods(panel, rows)):
        color = f"C{index}"
        mine = sorted((r for r in rows if _label(r) == method),
                      key=lambda r: -math.inf if r.x is None else r.x)
        if len(mine) == 1 and mine[0].x is None and xs:
            r = mine[0]
            ax.axhline(r.mean, color=color, linestyle="--", label=method)
            if r.ci_low is not None:
                ax.axhspan(r.ci_low, r.ci_high, color=color, alpha=0.15)
            continue
        curves.append((method, color, [r for r in mine if r.x is not None]))
    styles = distinct_series([method for method, _, _ in curves],
                             [[r.mean for r in mine] for _, _, mine in curves])
    for (_, color, mine), style in zip(curves, styles, strict=True):
        x = [r.x * style.shift for r in mine]
        ax.plot(x, [r.mean for r in mine], color=color, label=style.label,
                **{**style.kwargs, "markersize": style.kwargs["markersize"] - 2})
        if all(r.ci_low is not None for r in mine):
            ax.fill_between(x, [r.ci_low for r in mine], [r.ci_high for r in mine],
                            color=color, alpha=0.12)
    ax.set_xlabel(panel.x_name)


def _pair_panel(ax, panel: Panel, rows: Sequence[Row]) -> None:
    for index, method in enumerate(_methods(panel, rows)):
        ys = {r.x: r for r in rows if _label(r) == method and r.metric == panel.metric}
        xs = {r.x: r for r in rows if _label(r) == method and r.metric == panel.x_metric}
        keys = sorted((k for k in ys if k in xs), key=lambda k: -math.inf if k is None else k)
        if not keys:
            continue
        px = [xs[k] for k in keys]
        py = [ys[k] for k in keys]

        def err(points: list[Row]) -> list[list[float]] | None:
            if any(p.ci_low is None for p in points):
                return None
            return [[p.mean - p.ci_low for p in points], [p.ci_high - p.mean for p in points]]

        ax.errorbar([p.mean for p in px], [p.mean for p in py], xerr=err(px), yerr=err(py),
                    color=f"C{index}", marker="o", markersize=4, capsize=2, label=method)
    ax.set_xlabel(panel.x_metric)


def _paper_context(name: str) -> list[str]:
    """The paper's setting and claims for a study, from the packaged reference numbers."""
    from canopy.reference import paper_numbers

    entry = paper_numbers().get(name)
    if entry is None:
        return []
    lines = [f"Paper ({entry['source']}): {entry.get('setting', '')}".rstrip(": ")]
    lines += [f"- paper claims: {claim}" for claim in entry.get("claims", [])]
    return [*lines, ""]


def write_report(entries: Sequence[tuple[Study, StudyRun, list[Headline]]],
                 out: str | os.PathLike, *, quick: bool,
                 skipped: Sequence[tuple[str, str]] = ()) -> Path:
    """``report.md``: per study, each headline beside the paper's number and their ratio, the
    issue's target and whether ours meets it, and the figure; then the studies that could not
    run (``skipped``: name and reason)."""
    lines = ["# Canopy: reproduction of the paper's synthetic studies (Appendix D)", "",
             f"Run: {'--quick' if quick else 'full (paper seed counts)'}. "
             "Ours: mean over seeds [95% t-interval]. Ratio: ours / paper.", ""]
    header = ["headline", "ours", "95% CI", "paper", "ratio", "target", "met"]
    for study, result, headlines in entries:
        lines += [f"## {study.name}: {study.title}", "", *_paper_context(study.name),
                  f"{result.seeds} seeds, {result.n_tasks} cells "
                  f"({result.computed} computed, {result.reused} resumed), "
                  f"{result.seconds:.0f} s, backend {result.backend}.", ""]
        body = [[h.label, _fmt(h.ours), _ci(h.ci_low, h.ci_high), _fmt(h.paper),
                 _fmt(h.ratio), h.target or "–",
                 {True: "yes", False: "**no**", None: "–"}[h.passed]] for h in headlines]
        lines += [_markdown(header, body), f"![{study.name}]({study.name}/figure.png)", ""]
    if skipped:
        lines += ["## Not run", "", _markdown(["study", "why"], list(skipped))]
    path = Path(out) / "report.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path
