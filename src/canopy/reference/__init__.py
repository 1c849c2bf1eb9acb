"""The paper's reported numbers, shipped with the package (transcribed from the paper's text,
tables and figures; each entry names its section or table in ``source``), so reports and docs
can put ours beside theirs without a copy of the paper."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["paper_numbers"]


@cache
def _all() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("paper_numbers.json").read_text("utf-8")
    return json.loads(text)


def paper_numbers(study: str | None = None) -> dict[str, Any]:
    """Every study's entry, or one study's (``KeyError`` naming the known ones)."""
    numbers = {key: value for key, value in _all().items() if not key.startswith("_")}
    if study is None:
        return numbers
    if study not in numbers:
        raise KeyError(f"no paper numbers for {study!r}; known: {', '.join(sorted(numbers))}")
    return numbers[study]
