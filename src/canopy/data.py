"""Data registry: a data set's name and a file inside it -> a local path.

Resolution order for ``path("mooncake", "conversation_trace.jsonl")``:

1. ``$CANOPY_DATA_DIR/mooncake/conversation_trace.jsonl`` (CI and developer machines set
   ``CANOPY_DATA_DIR`` to the read-only mirror ``../shared/data``);
2. the user cache, ``$CANOPY_CACHE_DIR`` or ``~/.cache/canopy/data``;
3. a download of the upstream address into the user cache, when ``download=True`` (or
   ``CANOPY_DOWNLOAD=1``) and the data set has a public upstream file of that name.

Nothing is downloaded implicitly: a missing file raises :class:`DataNotFound` naming the
places looked in and how to get it. Data is never part of the package.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canopy import safeio

__all__ = ["DATASETS", "DataNotFound", "Dataset", "available", "bad_line", "data_dir",
           "jsonl_rows", "path"]

_GITHUB = "https://raw.githubusercontent.com/"


@dataclass(frozen=True)
class Dataset:
    """A registered data set: its upstream base address (``None`` where the mirror holds a
    derived file with no single upstream file), licence, and what it is."""

    name: str
    upstream: str | None
    license: str
    description: str


DATASETS: dict[str, Dataset] = {d.name: d for d in [
    Dataset("mooncake", _GITHUB + "kvcache-ai/Mooncake/main/FAST25-release/traces/",
            "Apache-2.0", "Mooncake FAST'25 serving traces (JSONL, 512-token block hashes)"),
    Dataset("routellm", _GITHUB + "lm-sys/RouteLLM/main/", "Apache-2.0",
            "RouteLLM logged outcomes: MMLU, GSM8K, MT-bench"),
    Dataset("mmlu", _GITHUB + "HaeChan0305/MLILAB-FedLLM/main/data/mmlu/", "MIT",
            "MMLU questions, dev and test"),
    Dataset("gsm8k", _GITHUB + "openai/grade-school-math/master/grade_school_math/data/",
            "MIT", "GSM8K train and test"),
    Dataset("bbh", _GITHUB + "suzgunmirac/BIG-Bench-Hard/main/", "MIT",
            "BIG-Bench Hard tasks and 3-shot CoT prompts"),
    Dataset("humaneval", _GITHUB + "openai/human-eval/master/data/", "MIT", "HumanEval"),
    Dataset("mbpp", _GITHUB + "google-research/google-research/master/mbpp/", "CC-BY-4.0",
            "MBPP problems"),
    Dataset("math500", None, "MIT", "MATH-500 problems"),
    Dataset("qwen25math_rm",
            _GITHUB + "QwenLM/Qwen2.5-Math/main/evaluation/data/eval_rm_maj_example/", "MIT",
            "100 MATH problems x 8 answers with reward-model scores and correctness"),
    Dataset("alpaca_eval", None, "Apache-2.0",
            "AlpacaEval preference matrix, output lengths, annotations"),
    Dataset("arena_bench_v1", None, "Apache-2.0", "Arena-bench v1 judge scores"),
    Dataset("can-ai-code", None, "MIT", "can-ai-code results (long format)"),
    Dataset("open_llm_leaderboard_v1",
            _GITHUB + "dsdanielpark/open-llm-leaderboard-report/main/assets/20230904/", "MIT",
            "Open LLM Leaderboard v1 snapshot, 1,291 models"),
]}


class DataNotFound(FileNotFoundError):
    """A registered data file is not available locally (and was not downloaded)."""


def data_dir() -> Path | None:
    """``$CANOPY_DATA_DIR`` as a path, or ``None`` when unset."""
    value = os.environ.get("CANOPY_DATA_DIR")
    return Path(value).expanduser() if value else None


def _cache_dir() -> Path:
    value = os.environ.get("CANOPY_CACHE_DIR")
    root = Path(value).expanduser() if value else Path.home() / ".cache" / "canopy"
    return root / "data"


def _dataset(name: str) -> Dataset:
    try:
        return DATASETS[name]
    except KeyError:
        known = ", ".join(sorted(DATASETS))
        raise KeyError(f"unknown data set {name!r}; known: {known}") from None


def path(name: str, file: str = "", *, download: bool | None = None) -> Path:
    """Local path of ``file`` (a path inside the data set, ``""`` for its folder)."""
    dataset = _dataset(name)
    relative = Path(name) / file
    candidates = [root / relative for root in (data_dir(), _cache_dir()) if root is not None]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    if download is None:
        download = os.environ.get("CANOPY_DOWNLOAD", "") == "1"
    if download and file and dataset.upstream is not None:
        return _download(dataset.upstream + file, _cache_dir() / relative)
    looked = ", ".join(str(c) for c in candidates)
    hint = (f"set CANOPY_DATA_DIR to a folder holding {name}/, or set CANOPY_DOWNLOAD=1 (in "
            f"Python: download=True) to fetch {dataset.upstream}{file}"
            if dataset.upstream and file else
            f"set CANOPY_DATA_DIR to a folder holding {name}/ (a whole data set is not "
            "downloaded, only single files of it)" if dataset.upstream else
            f"set CANOPY_DATA_DIR to a folder holding {name}/ (this data set has no single "
            "upstream file to download)")
    raise DataNotFound(f"{name}/{file} not found (looked in {looked or 'nothing'}); {hint}")


def available(name: str, file: str = "") -> bool:
    """Whether ``path(name, file)`` resolves locally without a download."""
    try:
        path(name, file, download=False)
    except DataNotFound:
        return False
    return True


def _download(url: str, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url, timeout=60) as response, tempfile.NamedTemporaryFile(
            dir=target.parent, delete=False) as partial:
        shutil.copyfileobj(response, partial)
    Path(partial.name).replace(target)
    return target


# -- reading data files with errors that point at the line ----------------------------------
def bad_line(file: str | Path, line: int, why: str) -> ValueError:
    """The error for a malformed line: ``file:line: why``."""
    return ValueError(f"{file}:{line}: {why}")


def jsonl_rows(file: str | Path, *, objects: bool = True, max_bytes: int = 256 * safeio.MiB,
               what: str = "file") -> Iterator[tuple[int, Any]]:
    """``(line number, parsed JSON)`` for each non-blank line of a JSON-lines file (a UTF-8
    byte-order mark is ignored), streamed through :mod:`canopy.safeio` (a regular file of at
    most ``max_bytes``, bounded lines and nesting). A line that is not JSON, or with
    ``objects`` not a JSON object, raises a ``ValueError`` naming the file and line."""
    yield from safeio.jsonl(file, max_bytes=max_bytes, objects=objects, what=what)
