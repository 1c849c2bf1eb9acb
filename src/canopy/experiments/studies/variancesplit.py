"""The variance split behind the routing prior (paper Appendix D, "From the rate to the data",
Figure 7 right panel), on a mirrored stand-in for RouterBench: RouteLLM's logged MMLU
outcomes (14,042 questions x Mixtral-8x7B and GPT-4-1106, correct or not), whose category
tree is MMLU's own (Hendrycks et al.: 4 categories > 17 subcategories > 57 subjects).

Paper (RouterBench, 36k prompts, 11 models, 86 categories): the category tree explains about
31% of the per-prompt value variance, and the benchmark-family tree about 53% of the
region-value variance. Here (our reading, the paper does not define "value" further):

- a prompt's value is the mean correctness over the pool's models (the leaf mean, Eq. 1);
  the regions are the 57 subjects, and "per-prompt variance explained" is the between-subject
  share of the prompts' value variance (eta^2);
- a region's value is the subject's mean; "region-value variance explained" is the share of
  the 57 subject values' variance between the 17 subcategories (the benchmark-family level).

eta^2 of k groups over n points is ``(k - 1) / (n - 1)`` on average with no structure at all:
0.004 for the subjects (negligible) but 0.29 for 57 subjects in 17 subcategories, so beside
each share we report that chance level. A seed is a bootstrap resample of the questions
(seed 0: the data as it is), which gives the intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from canopy.experiments.study import (
    Headline,
    Measurement,
    PaperValue,
    Row,
    Study,
    bounded,
)
from canopy.experiments.summary import lookup

__all__ = ["PAPER", "STUDY", "VarianceSplitParams", "eta_squared"]

METHOD = "RouteLLM MMLU (stand-in for RouterBench)"
PROMPT, REGION = "per-prompt variance explained by subjects", \
    "subject-value variance explained by subcategories"
PROMPT_CHANCE, REGION_CHANCE = "chance level (subjects)", "chance level (subcategories)"

#: App. D "From the rate to the data", Figure 7 right panel (RouterBench).
PAPER = (PaperValue(METHOD, None, PROMPT, 0.31), PaperValue(METHOD, None, REGION, 0.53))


@dataclass(frozen=True)
class VarianceSplitParams:
    """The data set (only RouteLLM's MMLU outcomes are mirrored with a category tree)."""

    dataset: str = "routellm-mmlu"

    def __post_init__(self) -> None:
        if self.dataset != "routellm-mmlu":
            raise ValueError(f"dataset must be 'routellm-mmlu', got {self.dataset!r}")


def eta_squared(values: np.ndarray, groups: np.ndarray) -> float:
    """Between-group share of the variance of ``values`` (``groups``: integer labels)."""
    total = float(np.sum((values - values.mean()) ** 2))
    if total == 0:
        return 0.0
    counts = np.bincount(groups)
    means = np.bincount(groups, weights=values) / np.maximum(counts, 1)
    return float(np.sum(counts * (means - values.mean()) ** 2) / total)


def cells(params: VarianceSplitParams) -> list[dict[str, Any]]:
    return [{"method": METHOD, "dataset": params.dataset}]


def run_cell(cell: dict[str, Any], seed: int) -> list[Measurement]:
    from canopy.apps.routing.datasets import routellm_mmlu

    outcomes = routellm_mmlu(depth=3)
    value = outcomes.quality.mean(axis=1)
    paths = np.array(outcomes.regions)
    if seed:
        rows = np.random.default_rng([seed, 0x5EED]).integers(0, value.size, value.size)
        value, paths = value[rows], paths[rows]
    subjects, subject_of = np.unique(paths, return_inverse=True)
    families = np.array(["/".join(s.split("/")[:2]) for s in subjects])
    _, family_of = np.unique(families, return_inverse=True)
    subject_value = np.bincount(subject_of, weights=value) / np.bincount(subject_of)
    share = bounded(0.0, 1.0)
    return [
        Measurement(METHOD, "", None, PROMPT, eta_squared(value, subject_of), share),
        Measurement(METHOD, "", None, REGION, eta_squared(subject_value, family_of), share),
        Measurement(METHOD, "", None, PROMPT_CHANCE,
                    (subjects.size - 1) / (value.size - 1), share),
        Measurement(METHOD, "", None, REGION_CHANCE,
                    (family_of.max()) / (subjects.size - 1), share),
    ]


def headlines(rows: Sequence[Row]) -> list[Headline]:
    out = []
    for metric, paper in ((PROMPT, 0.31), (REGION, 0.53)):
        row = lookup(rows, METHOD, metric)
        if row is not None:
            out.append(Headline(metric, row.mean, row.ci_low, row.ci_high, paper=paper))
    return out


STUDY = Study(
    name="variancesplit",
    title="variance of the routing value explained by the category tree (App. D, "
          "Figure 7 right)",
    module=__name__,
    params=VarianceSplitParams(),
    quick_params=VarianceSplitParams(),
    seeds=50,
    quick_seeds=8,
    cells=cells,
    run_cell=run_cell,
    paper=PAPER,
    headlines=headlines,
)
