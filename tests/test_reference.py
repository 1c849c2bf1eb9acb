"""The paper's reference numbers ship with the package and agree with the numbers the studies
print beside ours."""

from __future__ import annotations

import re

import pytest

from canopy.experiments.studies import available, get_study
from canopy.reference import paper_numbers


def _numbers(entry: object) -> set[float]:
    if isinstance(entry, bool):
        return set()
    if isinstance(entry, (int, float)):
        return {float(entry)}
    if isinstance(entry, str):
        return {float(x) for x in re.findall(r"\d+(?:\.\d+)?", entry.replace(",", ""))}
    if isinstance(entry, dict):
        return set().union(*map(_numbers, entry.values()), *map(_numbers, entry.keys()))
    if isinstance(entry, list):
        return set().union(*map(_numbers, entry))
    return set()


def test_every_study_has_its_packaged_entry():
    numbers = paper_numbers()
    assert {"routing", "cache", "trimming", "search"} <= set(numbers)
    for name in available():
        assert "source" in paper_numbers(name), name


@pytest.mark.parametrize("name", available())
def test_the_studies_paper_values_are_the_packaged_ones(name):
    packaged = _numbers(paper_numbers(name))
    for value in get_study(name).paper:
        assert value.value in packaged, (name, value)


def test_an_unknown_study_names_the_known_ones():
    with pytest.raises(KeyError, match="known: ablation"):
        paper_numbers("nope")
