"""Model pools from score tables (paper Section 4, "Top-k identification").

A :class:`Pool` is a set of candidates (models, checkpoints, prompts, configurations): one
name each, the *target* score in ``[0, 1]`` that top-``k`` identification ranks by, *features*
(scores on other benchmarks, used to build the pool tree without looking at the target),
optionally a matrix of real per-item outcomes (then the target is each row's item mean), and
optionally hierarchy columns (family, model, ...) for a tree the data already has.

Loaders:

- :func:`read_pool_csv`: a user's CSV, one row a candidate, a name column and score columns in
  ``[0, 1]`` or in percent. The scale is detected per column: a column whose values all lie in
  ``[0, 1]`` is read as fractions, one with any value above 1 as percent (all values must then
  lie in ``[0, 100]``). A percent column whose every value happens to be at most 1 would be
  misread; pass ``scale="percent"`` for such a table. A column where only a minority of the
  non-zero values exceed 1 is ambiguous and refused, naming those rows.
- :func:`open_llm_leaderboard`: the Open LLM Leaderboard v1 snapshot (1,291 models, ARC,
  HellaSwag, MMLU, TruthfulQA in percent); target one benchmark, features the other three.
- :func:`can_ai_code`: can-ai-code junior-v2 results: one leaf per evaluation run (a model under
  a prompt template, sampling parameters and runtime/quantization), items its 28 test x
  language cells (the pass fraction of each), hierarchy ``family -> model -> run``.
- :func:`alpaca_eval`: the AlpacaEval 2.0 preference matrix (62 models x 805 instructions,
  judge preference in ``[1, 2]`` against gpt4_1106_preview, mapped to ``[0, 1]``); items and
  target from the even-numbered instructions, features the per-source-data-set win rates on
  the odd-numbered ones (held out from the target).

Names repeated in a table (the leaderboard lists 99 models twice or more, at different
revisions) are kept as separate candidates, the later ones suffixed ``" #2"``, ``" #3"``.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from canopy import data, safeio
from canopy.validation import check_count

__all__ = [
    "LEADERBOARD_COLUMNS",
    "Pool",
    "aggregates_of_target",
    "alpaca_eval",
    "can_ai_code",
    "load_pool",
    "open_llm_leaderboard",
    "read_pool_csv",
]

Scale = Literal["auto", "percent", "fraction"]

#: Short names of the Open LLM Leaderboard v1 benchmark columns.
LEADERBOARD_COLUMNS = {
    "ARC": "ARC(25-shot)",
    "HellaSwag": "HellaSwag(10-shot)",
    "MMLU": "MMLU(5-shot)",
    "TruthfulQA": "TruthfulQA(0-shot)",
}


@dataclass(frozen=True, eq=False)
class Pool:
    """Candidates with a target score in ``[0, 1]``.

    Attributes:
        name: what the pool is (for tables).
        names: one unique label per candidate (row).
        target: the score top-``k`` identification ranks by, in ``[0, 1]``.
        target_name: the column it came from.
        features: ``(n, f)`` scores on other benchmarks in ``[0, 1]`` (``f`` may be 0).
        feature_names: their columns.
        items: optional ``(n, m)`` real per-item outcomes in ``[0, 1]``, ``NaN`` where missing;
            when given, ``target`` is each row's mean over its present items.
        groups: optional hierarchy columns, outermost first (``{"family": (...), ...}``).
        left_out: numeric columns not used as features because they contain the target
            (see :func:`aggregates_of_target`).
    """

    name: str
    names: tuple[str, ...]
    target: np.ndarray
    target_name: str
    features: np.ndarray
    feature_names: tuple[str, ...]
    items: np.ndarray | None = None
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    left_out: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.names)
        if n == 0:
            raise ValueError(f"pool {self.name!r} is empty")
        if len(set(self.names)) != n:
            raise ValueError(f"pool {self.name!r} has repeated names")
        target = np.asarray(self.target, dtype=float)
        if target.shape != (n,):
            raise ValueError(f"target has shape {target.shape}, expected ({n},)")
        _check_unit(target, f"target {self.target_name!r}")
        features = np.asarray(self.features, dtype=float).reshape(n, -1)
        if features.shape[1] != len(self.feature_names):
            raise ValueError(f"features has {features.shape[1]} columns for "
                             f"{len(self.feature_names)} feature_names")
        _check_unit(features, "features")
        if self.items is not None:
            items = np.asarray(self.items, dtype=float)
            if items.ndim != 2 or items.shape[0] != n:
                raise ValueError(f"items must have shape ({n}, m), got {items.shape}")
            present = ~np.isnan(items)
            empty = np.flatnonzero(~present.any(axis=1))
            if empty.size:
                raise ValueError(f"candidate {self.names[empty[0]]!r} has no item outcomes")
            _check_unit(items[present], "items")
            means = np.nanmean(items, axis=1)
            if not np.allclose(means, target):
                raise ValueError("target must be the row means of items")
            items.setflags(write=False)
            object.__setattr__(self, "items", items)
        for key, labels in self.groups.items():
            if len(labels) != n:
                raise ValueError(f"group column {key!r} has {len(labels)} labels for {n} rows")
        target.setflags(write=False)
        features.setflags(write=False)
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "features", features)
        object.__setattr__(self, "groups", {k: tuple(map(str, v)) for k, v in
                                            self.groups.items()})

    @property
    def size(self) -> int:
        return len(self.names)

    def top_rows(self, k: int) -> np.ndarray:
        """Rows of the ``k`` best candidates by target, best first (ties by row)."""
        check_count(k, "k", high=self.size)
        return np.argsort(-self.target, kind="stable")[:k]

    def feature_matrix(self, columns: Sequence[str] | None = None) -> np.ndarray:
        """The feature columns named (all by default), as an ``(n, len(columns))`` array."""
        if columns is None:
            return self.features
        index = []
        for column in columns:
            if column not in self.feature_names:
                hint = "it is the target" if column == self.target_name else (
                    "known: " + ", ".join(self.feature_names))
                raise ValueError(f"no feature column {column!r} in pool {self.name!r}; {hint}")
            index.append(self.feature_names.index(column))
        return self.features[:, index]


# ---------------------------------------------------------------------- user CSV
def read_pool_csv(source: str | Path, *, target: str, name_column: str | None = None,
                  feature_columns: Sequence[str] | None = None,
                  group_columns: Sequence[str] = (), scale: Scale = "auto",
                  pool_name: str | None = None) -> Pool:
    """A pool from a CSV file (``.csv`` or ``.csv.gz``), one row a candidate.

    ``name_column`` defaults to the first column. ``feature_columns`` defaults to every other
    column whose values are all numbers (excluding the target, the name and the group
    columns). Scores are scaled per column as the module docstring says. Errors name the file,
    the column and the line: a ragged row, an empty or non-numeric score, a score outside
    ``[0, 100]``, a missing column.
    """
    source = Path(source)
    header, rows = _read_csv(source)
    label = pool_name or source.name
    name_column = header[0] if name_column is None else name_column
    for column, what in [(name_column, "name column"), (target, "target column"),
                         *((c, "group column") for c in group_columns)]:
        if column not in header:
            raise ValueError(f"{source}: no {what} {column!r}; columns: {', '.join(header)}")
    position = {column: i for i, column in enumerate(header)}
    left_out: list[str] = []
    if feature_columns is None:
        taken = {name_column, target, *group_columns}
        feature_columns = [c for c in header if c not in taken
                           and _all_numbers(row[position[c]] for row in rows)]
        candidates = {c: _scores(source, c, [row[position[c]] for row in rows], scale)
                      for c in feature_columns}
        left_out = aggregates_of_target(
            _scores(source, target, [row[position[target]] for row in rows], scale),
            candidates)
        feature_columns = [c for c in feature_columns if c not in left_out]
    else:
        for column in feature_columns:
            if column not in header:
                raise ValueError(f"{source}: no feature column {column!r}; "
                                 f"columns: {', '.join(header)}")
            if column == target:
                raise ValueError(f"{source}: the target {target!r} cannot also be a feature")
    values = {c: _scores(source, c, [row[position[c]] for row in rows], scale)
              for c in [target, *feature_columns]}
    names = _unique([row[position[name_column]] for row in rows])
    features = np.column_stack([values[c] for c in feature_columns]) if feature_columns else (
        np.empty((len(rows), 0)))
    groups = {c: tuple(row[position[c]] for row in rows) for c in group_columns}
    return Pool(label, names, values[target], target, features, tuple(feature_columns),
                groups=groups, left_out=tuple(left_out))


def aggregates_of_target(target: np.ndarray, columns: Mapping[str, np.ndarray], *,
                         fit: float = 0.999, weight: float = 0.05) -> list[str]:
    """The columns that contain the target: each is fitted as a non-negative combination of
    the target and the other columns (plus a constant); one that such a combination explains
    (``R^2 >= fit``) with a target weight of at least ``weight`` is an aggregate such as a
    leaderboard's Average, and would leak the target into the tree. Needs at least three rows
    per column fitted; fewer, and nothing is flagged."""
    from scipy.optimize import nnls

    names = list(columns)
    n = len(target)
    if n < 3 * (len(names) + 2):
        return []
    found = []
    for name in names:
        y = np.asarray(columns[name], dtype=float)
        spread = float(np.sum((y - y.mean()) ** 2))
        if spread == 0:
            continue
        design = np.column_stack([target, *(columns[o] for o in names if o != name),
                                  np.ones(n), -np.ones(n)])
        coefficients, residual = nnls(design, y)
        if 1 - residual**2 / spread >= fit and coefficients[0] >= weight:
            found.append(name)
    return found


MAX_POOL_BYTES = 32 * safeio.MiB
"""A pool file (unpacked) above this size is refused (``CANOPY_MAX_INPUT_MB`` raises it)."""


def _read_csv(source: Path) -> tuple[list[str], list[list[str]]]:
    text = safeio.read_text(source, max_bytes=MAX_POOL_BYTES, what="pool file")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        table = [row for row in reader if row]
    except csv.Error as error:
        raise safeio.BadInput(source, f"malformed CSV ({error})", reader.line_num) from None
    if not table:
        raise ValueError(f"{source}: empty file, expected a header and one row per candidate")
    header = [column.strip() for column in table[0]]
    if len(set(header)) != len(header):
        raise ValueError(f"{source}: repeated column names in the header")
    if len(table) < 2:
        raise ValueError(f"{source}: a header but no candidates")
    for number, row in enumerate(table[1:], start=2):
        if len(row) != len(header):
            raise ValueError(f"{source}, row {number}: {len(row)} fields, the header has "
                             f"{len(header)}")
    return header, [[cell.strip() for cell in row] for row in table[1:]]


def _all_numbers(cells: Iterable[str]) -> bool:
    for cell in cells:
        try:
            float(cell)
        except ValueError:
            return False
    return True


def _scores(source: Path | str, column: str, cells: Sequence[str], scale: Scale) -> np.ndarray:
    values = np.empty(len(cells))
    for number, cell in enumerate(cells):
        try:
            values[number] = float(cell)
        except ValueError:
            raise ValueError(f"{source}, row {number + 2}: column {column!r} holds {cell!r}, "
                             "not a number") from None
        if not math.isfinite(values[number]):
            raise ValueError(f"{source}, row {number + 2}: column {column!r} holds {cell!r}")
    if scale not in ("auto", "percent", "fraction"):
        raise ValueError(f"scale must be 'auto', 'percent' or 'fraction', got {scale!r}")
    percent = scale == "percent" or (scale == "auto" and values.max() > 1.0)
    above = np.flatnonzero(values > 1.0)
    if scale == "auto" and 0 < 2 * above.size < np.count_nonzero(values):
        rows = ", ".join(str(row + 2) for row in above[:5])
        raise ValueError(f"{source}: column {column!r} looks like fractions but rows {rows} "
                         "hold values above 1; fix them, or pass scale='percent' if the "
                         "column is in percent")
    high = 100.0 if percent else 1.0
    bad = np.flatnonzero((values < 0) | (values > high))
    if bad.size:
        unit = "percent, [0, 100]" if percent else "[0, 1]"
        raise ValueError(f"{source}, row {bad[0] + 2}: column {column!r} holds "
                         f"{cells[bad[0]]!r}, outside {unit}")
    return values / high


def _unique(names: Sequence[str]) -> tuple[str, ...]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name} #{seen[name]}")
    if len(set(out)) != len(out):
        raise ValueError("candidate names collide with the ' #n' suffixes for repeats")
    return tuple(out)


def _check_unit(values: np.ndarray, what: str) -> None:
    if values.size and not np.all(np.isfinite(values)):
        raise ValueError(f"{what} contain NaN or infinite values")
    if values.size and (values.min() < 0 or values.max() > 1):
        raise ValueError(f"{what} must lie in [0, 1], got [{values.min():.4g}, "
                         f"{values.max():.4g}]")


# ---------------------------------------------------------------------- public tables
def open_llm_leaderboard(target: str = "MMLU") -> Pool:
    """The Open LLM Leaderboard v1 snapshot of 2023-09-04 (1,291 rows): ``target`` is one of
    ARC, HellaSwag, MMLU, TruthfulQA; the features are the other three (the Average, which
    contains the target, and the parameter count are left out). Outcomes are Bernoulli."""
    if target not in LEADERBOARD_COLUMNS:
        raise ValueError(f"target must be one of {', '.join(LEADERBOARD_COLUMNS)}, "
                         f"got {target!r}")
    file = data.path("open_llm_leaderboard_v1", "20230904.csv")
    features = [column for key, column in LEADERBOARD_COLUMNS.items() if key != target]
    pool = read_pool_csv(file, target=LEADERBOARD_COLUMNS[target], name_column="Model",
                         feature_columns=features, scale="percent",
                         pool_name="open-llm-leaderboard")
    short = {column: key for key, column in LEADERBOARD_COLUMNS.items()}
    return Pool(pool.name, pool.names, pool.target, target, pool.features,
                tuple(short[c] for c in pool.feature_names))


def can_ai_code(interview: str = "junior-v2") -> Pool:
    """can-ai-code results of one interview: a leaf per evaluation run, its items the
    test x language cells (pass fraction ``passed/total``; a cell recorded twice is averaged,
    a cell never run is missing), groups ``family`` and ``model``. Features: the run's pass
    rate in each language is the target's own data, so none are given; use the families."""
    file = data.path("can-ai-code", "results_long.csv.gz")
    with gzip.open(file, "rt", encoding="utf-8", newline="") as handle:
        records = [row for row in csv.DictReader(handle) if row["interview"] == interview]
    if not records:
        raise ValueError(f"no can-ai-code runs for interview {interview!r}")
    cells = sorted({(row["test"], row["language"]) for row in records})
    cell_index = {cell: j for j, cell in enumerate(cells)}
    runs: dict[str, dict[str, str]] = {}
    sums: dict[tuple[str, int], list[float]] = defaultdict(list)
    for row in records:
        runs.setdefault(row["run_id"], row)
        total = float(row["total"])
        sums[row["run_id"], cell_index[row["test"], row["language"]]].append(
            float(row["passed"]) / total if total > 0 else math.nan)
    run_ids = sorted(runs, key=lambda r: (runs[r]["family_dir"], runs[r]["model"], r))
    items = np.full((len(run_ids), len(cells)), np.nan)
    row_of = {run: i for i, run in enumerate(run_ids)}
    for (run, j), fractions in sums.items():
        items[row_of[run], j] = float(np.mean(fractions))
    groups = {"family": tuple(runs[r]["family_dir"] for r in run_ids),
              "model": tuple(runs[r]["model"] for r in run_ids)}
    return Pool(f"can-ai-code-{interview}", tuple(run_ids), np.nanmean(items, axis=1),
                "pass rate", np.empty((len(run_ids), 0)), (), items=items, groups=groups)


def alpaca_eval() -> Pool:
    """AlpacaEval 2.0 (weighted GPT-4-turbo judge): 62 models x 805 instructions. Preference
    ``p`` in ``[1, 2]`` becomes ``p - 1`` in ``[0, 1]`` (1 = beats gpt4_1106_preview). Items
    and target: the even-numbered instructions (403); features: win rates on the odd-numbered
    ones within each source data set (helpful_base, koala, oasst, selfinstruct, vicuna). Three
    models were judged on 64 instructions only; a source set they lack takes their overall
    held-out win rate."""
    matrix_file = data.path("alpaca_eval", "weighted_alpaca_eval_gpt4_turbo_preference_matrix.csv")
    header, rows = _read_csv(matrix_file)
    names = tuple(row[0] for row in rows)
    prefs = np.array([[float(cell) - 1.0 if cell else np.nan for cell in row[1:]]
                      for row in rows])
    instructions = header[1:]
    source = _alpaca_sources(set(instructions))
    held = np.arange(len(instructions)) % 2 == 1
    sets = sorted({source[text] for text in instructions})
    by_set = np.array([[source[t] == s for t in instructions] for s in sets])
    counts = np.stack([(~np.isnan(prefs[:, held & mask])).sum(axis=1) for mask in by_set], 1)
    sums = np.stack([np.nansum(prefs[:, held & mask], axis=1) for mask in by_set], 1)
    overall = sums.sum(axis=1, keepdims=True) / counts.sum(axis=1, keepdims=True)
    features = np.where(counts > 0, sums / np.maximum(counts, 1), overall)
    items = prefs[:, ~held]
    return Pool("alpaca-eval", _unique(names), np.nanmean(items, axis=1), "win rate",
                features, tuple(f"win rate ({s}, held out)" for s in sets), items=items)


def _alpaca_sources(instructions: set[str]) -> dict[str, str]:
    file = data.path("alpaca_eval", "annotations_long.csv.gz")
    found: dict[str, str] = {}
    with gzip.open(file, "rt", encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            text = row["instruction"].strip()
            if text in instructions and text not in found:
                found[text] = row["dataset"]
                if len(found) == len(instructions):
                    break
    missing = instructions.difference(found)
    if missing:
        raise ValueError(f"{len(missing)} AlpacaEval instructions have no source data set")
    return found


_POOLS = {
    "open-llm-leaderboard": open_llm_leaderboard,
    "can-ai-code": can_ai_code,
    "alpaca-eval": alpaca_eval,
}


def load_pool(name: str) -> Pool:
    """One of the public pools by name: ``open-llm-leaderboard`` (target MMLU; another
    benchmark with ``open-llm-leaderboard:ARC`` etc.), ``can-ai-code`` (junior-v2) or
    ``alpaca-eval``."""
    base, _, option = name.partition(":")
    if base not in _POOLS or (option and base != "open-llm-leaderboard"):
        raise ValueError(f"unknown pool {name!r}; known: {', '.join(_POOLS)} "
                         f"(and open-llm-leaderboard:<{'|'.join(LEADERBOARD_COLUMNS)}>)")
    if option:
        return open_llm_leaderboard(option)
    return _POOLS[base]()
