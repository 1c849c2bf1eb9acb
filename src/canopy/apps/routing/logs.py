"""A user's own routing logs, and RouterBench's pickle format.

Long format (CSV with a header, or JSONL), one row per query and model:

====================================  ===========================================================
``query_id``                          any string; the same id across the models of one query
``region``                            region path, ``/``-separated (``stem/physics``); empty
                                      for the root
``model``                             model name
``quality``                           number in [0, 1]
``cost``                              dollars, >= 0
``input_tokens``, ``output_tokens``   optional, both or neither
====================================  ===========================================================

A query must name the same region on all its rows. A query that lacks a row for some model
is dropped (replay needs every model's outcome), and the drop is listed in ``notes``; bad
rows raise ``ValueError`` naming the file and line.

RouterBench (Hu et al. 2024) ships a pandas pickle with one row per prompt: ``sample_id``,
``eval_name``, a score column per model, ``<model>|total_cost`` columns (and others that are
ignored). Regions are ``family/eval_name`` with ``family`` the eval name up to its first
``-`` or ``.`` (``mmlu-anatomy.val.5`` -> ``mmlu/mmlu-anatomy.val.5``).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from canopy import safeio
from canopy.data import jsonl_rows
from canopy.regional.outcomes import Outcomes

__all__ = ["LONG_COLUMNS", "read_long", "read_routerbench"]

LONG_COLUMNS = ("query_id", "region", "model", "quality", "cost")
_TOKENS = ("input_tokens", "output_tokens")


MAX_LOG_BYTES = 32 * safeio.MiB
"""A log above this size is refused (``CANOPY_MAX_INPUT_MB`` raises the cap)."""


def _rows(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    if path.suffix.lower() in {".jsonl", ".ndjson"}:
        yield from jsonl_rows(path, max_bytes=MAX_LOG_BYTES, what="routing log")
    elif path.suffix.lower() == ".csv":
        numbered = safeio.lines(path, max_bytes=MAX_LOG_BYTES, what="routing log")
        reader = csv.DictReader(text for _, text in numbered)
        try:
            missing = set(LONG_COLUMNS) - set(reader.fieldnames or ())
            if missing:
                raise ValueError(f"{path}: header lacks columns {sorted(missing)}")
            yield from enumerate(reader, start=2)
        except csv.Error as error:
            raise safeio.BadInput(path, f"malformed CSV ({error})", reader.line_num) from None
    else:
        raise ValueError(f"{path}: expected a .csv or .jsonl file")


def _number(row: dict[str, object], key: str, where: str, low: float,
            high: float = math.inf) -> float:
    try:
        value = float(row[key])  # type: ignore[arg-type]
    except KeyError:
        raise ValueError(f"{where}: missing column {key!r}") from None
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {key} {row[key]!r} is not a number") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{where}: {key} {value} is outside [{low}, {high}]")
    return value


def read_long(path: str | Path, *, name: str | None = None) -> Outcomes:
    """Read a long-format log (CSV or JSONL) into :class:`Outcomes`."""
    path = Path(path)
    cells: dict[str, dict[str, tuple[float, ...]]] = {}
    regions: dict[str, str] = {}
    models: dict[str, None] = {}
    with_tokens: bool | None = None
    for line_number, row in _rows(path):
        where = f"{path}:{line_number}"
        for key in ("query_id", "model"):
            value = row.get(key)
            if value is None or isinstance(value, (dict, list)) or not str(value).strip():
                raise ValueError(f"{where}: empty or missing {key}")
        query, model = str(row["query_id"]), str(row["model"])
        region = str(row.get("region") or "")
        if regions.setdefault(query, region) != region:
            raise ValueError(f"{where}: query {query!r} was in region {regions[query]!r}, "
                             f"now {region!r}")
        has = [row.get(k) not in (None, "") for k in _TOKENS]
        if any(has) and not all(has):
            raise ValueError(f"{where}: give both input_tokens and output_tokens or neither")
        if with_tokens is None:
            with_tokens = all(has)
        elif with_tokens != all(has):
            raise ValueError(f"{where}: token columns on some rows but not on others")
        values = (_number(row, "quality", where, 0.0, 1.0), _number(row, "cost", where, 0.0),
                  *(_number(row, k, where, 0.0) for k in _TOKENS if with_tokens))
        if model in cells.setdefault(query, {}):
            raise ValueError(f"{where}: second row for query {query!r} and model {model!r}")
        cells[query][model] = values
        models[model] = None
    if not cells:
        raise ValueError(f"{path}: no rows")
    names = tuple(models)
    complete = [q for q, v in cells.items() if len(v) == len(names)]
    if not complete:
        raise ValueError(f"{path}: no query has a row for every model {names}")
    table = np.array([[cells[q][m] for m in names] for q in complete])
    notes = (f"dropped {len(cells) - len(complete)} queries without a row for every model",)
    tokens = (table[:, :, 2], table[:, :, 3]) if with_tokens else (None, None)
    return Outcomes(name or path.stem, tuple(complete), tuple(regions[q] for q in complete),
                    names, table[:, :, 0], table[:, :, 1], *tokens, notes)


def _region(eval_name: str) -> str:
    family = re.split(r"[-.]", eval_name, maxsplit=1)[0]
    return f"{family}/{eval_name}".replace("//", "/")


def read_routerbench(path: str | Path, *, models: list[str] | None = None,
                     name: str | None = None, trust_pickle: bool = False) -> Outcomes:
    """Read RouterBench's pickle (``routerbench_0shot.pkl`` and the like); needs pandas.

    Unpickling runs whatever code the file names, so it is refused unless ``trust_pickle``
    says the file comes from a trusted source (the CLI's ``--trust-pickle``)."""
    if not trust_pickle:
        raise ValueError(f"{path}: refusing to unpickle a file, which can run arbitrary code; "
                         "pass --trust-pickle (trust_pickle=True) if you trust its source")
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("reading RouterBench pickles needs pandas "
                          "(pip install pandas)") from None
    path = Path(path)
    frame = pd.read_pickle(path)
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"{path}: expected a pickled pandas DataFrame, got {type(frame)}")
    for column in ("eval_name",):
        if column not in frame.columns:
            raise ValueError(f"{path}: no {column!r} column")
    found = [c[:-len("|total_cost")] for c in frame.columns
             if isinstance(c, str) and c.endswith("|total_cost")]
    models = found if models is None else models
    for model in models:
        if model not in frame.columns or f"{model}|total_cost" not in frame.columns:
            raise KeyError(f"{path}: no score and total_cost columns for model {model!r}")
    if not models:
        raise ValueError(f"{path}: no '<model>|total_cost' columns")
    quality = frame[models].to_numpy(dtype=float)
    cost = frame[[f"{m}|total_cost" for m in models]].to_numpy(dtype=float)
    keep = np.isfinite(quality).all(1) & np.isfinite(cost).all(1)
    ids = (frame["sample_id"].astype(str) if "sample_id" in frame.columns
           else frame.index.astype(str)).to_numpy()
    regions = [_region(str(e)) for e in frame["eval_name"].to_numpy()]
    return Outcomes(name or path.stem, tuple(ids[keep]),
                    tuple(r for r, k in zip(regions, keep, strict=True) if k), tuple(models),
                    quality[keep], cost[keep],
                    notes=(f"dropped {int((~keep).sum())} prompts with a missing score or "
                           "cost",))
