"""The study interface: what a study module provides to the runner, the summary and the outputs.

A study (one part of the paper's Appendix D) is a grid of *cells* times seeds. A cell is a
JSON-able ``dict`` holding everything that determines its result (method, x value, budget, ...),
so that its hash together with the seed is a complete key for the resume store. Running one
cell for one seed returns :class:`Measurement` s; the summary averages them over seeds into
:class:`Row` s with 95% intervals; :class:`PaperValue` s are the paper's numbers printed beside
ours; :class:`Headline` s are the few numbers ``canopy reproduce`` puts in ``report.md``.

A study module defines one module-level ``STUDY = Study(...)`` and is listed by name in
:data:`canopy.experiments.studies.STUDIES` (see ``docs/experiments.md``); a user's own study
runs unlisted, by reference ``package.module:NAME``
(:func:`~canopy.experiments.runner.load_study`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from canopy.validation import check_count, check_nonnegative, check_number, check_positive

__all__ = [
    "PROPORTION",
    "UNBOUNDED",
    "Headline",
    "Measurement",
    "Panel",
    "PaperValue",
    "Row",
    "Study",
    "bounded",
    "check_all_nonnegative",
    "check_all_positive",
    "check_budget",
    "kind_bounds",
]

#: Metric kinds: a proportion lives in [0, 1] (recall, accuracy, coverage); ``bounded(low,
#: high)`` in a declared range; an unbounded metric (regret, error, counts) gets the plain
#: t-interval. The kind decides the interval, never the metric's name.
PROPORTION = "proportion"
#: An unbounded metric's kind (regret, error, counts): the plain t-interval.
UNBOUNDED = "unbounded"


def bounded(low: float, high: float) -> str:
    """The kind of a metric whose values lie in ``[low, high]``."""
    check_nonnegative(high - low, "high - low")
    return f"bounded {float(low)!r} {float(high)!r}"


def kind_bounds(kind: str) -> tuple[float, float] | None:
    """The range a metric kind keeps its intervals in (``None``: unbounded)."""
    if kind == PROPORTION:
        return 0.0, 1.0
    if kind == UNBOUNDED:
        return None
    name, *ends = str(kind).split()
    try:
        if name == "bounded" and len(ends) == 2:
            low, high = float(ends[0]), float(ends[1])
            if math.isfinite(low) and math.isfinite(high) and low <= high:
                return low, high
    except ValueError:
        pass
    raise ValueError(f"metric kind must be {PROPORTION!r}, {UNBOUNDED!r} or "
                     f"bounded(low, high), got {kind!r}")


class Measurement(NamedTuple):
    """One number measured by one cell for one seed. ``x`` is the position on the study's
    x axis (``x_name``); ``None`` marks a value constant across that axis (drawn as a band).
    ``kind`` declares the metric's range (:data:`PROPORTION`, :func:`bounded`,
    :data:`UNBOUNDED`), which decides its interval. ``objective`` names the problem of a
    study that runs every method on several (``None`` for a study of one problem)."""

    method: str
    x_name: str
    x: float | None
    metric: str
    value: float
    kind: str = UNBOUNDED
    objective: str | None = None


@dataclass(frozen=True)
class Row:
    """Mean over seeds of one (method, x, metric, objective) with a 95% t-interval
    (``None`` for n < 2)."""

    method: str
    x_name: str
    x: float | None
    metric: str
    mean: float
    ci_low: float | None
    ci_high: float | None
    n: int
    objective: str | None = None


@dataclass(frozen=True)
class PaperValue:
    """A number the paper reports, on the same (method, x, metric) key as our rows."""

    method: str
    x: float | None
    metric: str
    value: float


@dataclass(frozen=True)
class Headline:
    """One headline of a study: our value (with its interval), the paper's, and the target the
    issue sets (``passed`` is ``None`` where there is no pass/fail target)."""

    label: str
    ours: float
    ci_low: float | None = None
    ci_high: float | None = None
    paper: float | None = None
    target: str = ""
    passed: bool | None = None

    @property
    def ratio(self) -> float | None:
        """Ours divided by the paper's value, where both exist and the paper's is non-zero."""
        if self.paper is None or self.paper == 0 or not math.isfinite(self.ours):
            return None
        return self.ours / self.paper


@dataclass(frozen=True)
class Panel:
    """One panel of a study's figure.

    ``kind="curve"``: ``metric`` against the x axis ``x_name``, one line per method with its
    95% band (a method measured at ``x=None`` is a horizontal band). ``kind="pair"``: one point
    per (method, x) at (mean of ``x_metric``, mean of ``metric``) with both intervals as error
    bars, points of a method joined in x order. ``diagonal`` draws the line y = x (a
    recovered quantity against its truth).
    """

    metric: str
    x_name: str = ""
    kind: Literal["curve", "pair"] = "curve"
    x_metric: str = ""
    title: str = ""
    log_x: bool = False
    log_y: bool = False
    diagonal: bool = False
    methods: tuple[str, ...] = ()


@dataclass(frozen=True)
class Study:
    """A study: its parameters, its grid of cells, the cell function, and how it is reported.

    Attributes:
        name: registry name (``canopy run NAME``).
        title: one line for ``canopy list`` and ``report.md``.
        module: the module defining ``STUDY`` (workers import it by this name), or
            ``module:NAME`` for a study under another name.
        params: full-run parameters, a frozen dataclass that validates itself.
        quick_params: parameters of ``--quick``.
        seeds, quick_seeds: default seed counts (the paper's, and the quick run's).
        cells: ``params -> list of JSON-able dicts``, in the order rows are reported.
        run_cell: ``(cell, seed) -> list[Measurement]``; must be deterministic in its arguments.
        paper: the paper's numbers for this study (cited in the study module).
        headlines: ``rows -> list[Headline]`` for ``report.md``.
        panels: the figure's panels (default: one curve per (x_name, metric)).
    """

    name: str
    title: str
    module: str
    params: Any
    quick_params: Any
    seeds: int
    quick_seeds: int
    cells: Callable[[Any], list[dict[str, Any]]]
    run_cell: Callable[[Mapping[str, Any], int], list[Measurement]]
    paper: tuple[PaperValue, ...] = ()
    headlines: Callable[[Sequence[Row]], list[Headline]] = field(default=lambda rows: [])
    panels: tuple[Panel, ...] = ()

    def __post_init__(self) -> None:
        if not dataclasses.is_dataclass(self.params):
            raise TypeError(f"study {self.name!r}: params must be a dataclass instance")
        check_count(self.seeds, "seeds")
        check_count(self.quick_seeds, "quick_seeds")

    def with_overrides(self, params: Any, overrides: Mapping[str, str]) -> Any:
        """``params`` with fields replaced from ``KEY=VALUE`` strings (``--set``), each parsed
        to the type of the field's current value; unknown keys and bad values raise."""
        fields = {f.name for f in dataclasses.fields(params)}
        changes: dict[str, Any] = {}
        for key, text in overrides.items():
            if key not in fields:
                raise ValueError(f"study {self.name!r} has no parameter {key!r}; "
                                 f"known: {', '.join(sorted(fields))}")
            changes[key] = _parse_like(key, text, getattr(params, key))
        return dataclasses.replace(params, **changes)


def _parse_like(key: str, text: str, current: Any) -> Any:
    """Parse ``text`` to the type of ``current`` (bool, int, float, str, or a tuple of those
    written comma-separated)."""
    try:
        if isinstance(current, bool):
            if text.lower() not in {"true", "false", "1", "0"}:
                raise ValueError(text)
            return text.lower() in {"true", "1"}
        if isinstance(current, tuple):
            item = current[0] if current else 0.0
            return tuple(_parse_like(key, part.strip(), item) for part in text.split(",") if part)
        return type(current)(text)
    except (TypeError, ValueError):
        raise ValueError(f"parameter {key}={text!r}: expected a value like {current!r}") from None


def check_budget(name: str, budget: float, cheapest: float) -> float:
    """Validate a cost budget: finite and enough for at least one query of cost ``cheapest``."""
    budget = check_number(budget, name)
    if budget < cheapest:
        raise ValueError(f"{name}={budget:g} is below the cost of one query ({cheapest:g})")
    return float(budget)


def _each(values: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    for name, value in values.items():
        for item in value if isinstance(value, tuple) else (value,):
            yield name, item


def check_all_nonnegative(**values: Any) -> None:
    """Validate named numbers (noise scales): finite and >= 0; tuples item by item."""
    for name, item in _each(values):
        check_nonnegative(item, name)


def check_all_positive(**values: Any) -> None:
    """Validate named numbers (Lipschitz constants): finite and > 0; tuples item by item."""
    for name, item in _each(values):
        check_positive(item, name)
