"""Routing data sets read through the data registry (:func:`canopy.data.path`), each as
:class:`~canopy.regional.outcomes.Outcomes`.

Costs are ``price table x tokens``: token counts are the offline estimate of
:func:`~canopy.apps.routing.prices.estimate_tokens` (four characters a token) on the logged
prompt and response texts where the data holds them, and the documented constants below
where it does not. A model missing from the price table is refused (``KeyError``).
"""

from __future__ import annotations

import csv
import gzip
import sys
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from canopy import data
from canopy.apps.routing.logs import read_long, read_routerbench
from canopy.apps.routing.mmlu_groups import SUBJECT_GROUPS
from canopy.apps.routing.prices import PriceTable, estimate_tokens
from canopy.data import jsonl_rows
from canopy.regional.outcomes import Outcomes

__all__ = [
    "ARENA_INPUT_TOKENS",
    "ARENA_OUTPUT_TOKENS",
    "DATASETS",
    "MMLU_OUTPUT_TOKENS",
    "alpaca_eval",
    "arena_bench",
    "load",
    "mt_bench",
    "priced_costs",
    "routellm_gsm8k",
    "routellm_mmlu",
]

ROUTELLM_MODELS = ("mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview")
MMLU_OUTPUT_TOKENS = 5        # a multiple-choice answer: the letter and a few tokens around it
ARENA_INPUT_TOKENS = 150      # the mirror holds no texts: a typical Arena-Hard prompt ...
ARENA_OUTPUT_TOKENS = 500     # ... and answer length, the same for every model

csv.field_size_limit(sys.maxsize)


def priced_costs(models: Sequence[str], input_tokens: np.ndarray, output_tokens: np.ndarray,
                 prices: PriceTable | None = None) -> np.ndarray:
    """``cost[i, m]`` in dollars from per-query token counts; unpriced models are refused."""
    prices = prices or PriceTable.default()
    table = np.array([[prices.price(m).input, prices.price(m).output] for m in models])
    return (input_tokens * table[:, 0] + output_tokens * table[:, 1]) / 1e6


def _truth(text: str) -> float:
    value = text.strip().lower()
    if value not in {"true", "false"}:
        raise ValueError(f"expected True/False, got {text!r}")
    return 1.0 if value == "true" else 0.0


def routellm_mmlu(*, depth: int = 3, prices: PriceTable | None = None) -> Outcomes:
    """RouteLLM MMLU outcomes: 14,042 questions x (Mixtral-8x7B, GPT-4-1106), correctness.

    Regions: ``depth=1`` the 57 subjects; ``2`` ``category/subject``; ``3``
    ``category/subcategory/subject`` (Hendrycks et al.'s grouping). Input tokens from the
    question text, ``MMLU_OUTPUT_TOKENS`` output tokens."""
    if depth not in (1, 2, 3):
        raise ValueError(f"depth must be 1, 2 or 3, got {depth!r}")
    folder = data.path("routellm", "routellm/evals/mmlu/responses")
    ids, regions, quality, tokens = [], [], [], []
    for file in sorted(folder.glob("mmlu_*.csv")):
        subject = file.stem.removeprefix("mmlu_")
        category, sub = SUBJECT_GROUPS[subject]
        region = "/".join((category, sub, subject)[3 - depth:])
        with open(file, newline="", encoding="utf-8-sig") as handle:
            for row_number, row in enumerate(csv.DictReader(handle)):
                ids.append(f"{subject}/{row_number}")
                regions.append(region)
                quality.append([_truth(row[m]) for m in ROUTELLM_MODELS])
                tokens.append(estimate_tokens(row["prompt"]))
    inputs = np.repeat(np.array(tokens, float)[:, None], len(ROUTELLM_MODELS), axis=1)
    outputs = np.full_like(inputs, MMLU_OUTPUT_TOKENS)
    return Outcomes("routellm-mmlu", tuple(ids), tuple(regions), ROUTELLM_MODELS,
                    np.array(quality), priced_costs(ROUTELLM_MODELS, inputs, outputs, prices),
                    inputs, outputs)


def routellm_gsm8k(*, prices: PriceTable | None = None) -> Outcomes:
    """RouteLLM GSM8K: 1,319 problems x 2 models, correctness; tokens from the logged
    responses. GSM8K has no categories: the regions are the terciles of the question's
    length in words (``short``, ``medium``, ``long``), a feature known at routing time."""
    file = data.path("routellm", "routellm/evals/gsm8k/gsm8k_responses.csv")
    with open(file, newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.DictReader(handle))
    words = np.array([len(r["prompt"].split()) for r in rows])
    cuts = np.quantile(words, [1 / 3, 2 / 3])
    names = np.array(["short", "medium", "long"])
    regions = names[np.searchsorted(cuts, words, side="right")]
    quality = np.array([[_truth(r[m]) for m in ROUTELLM_MODELS] for r in rows])
    inputs = np.array([[estimate_tokens(r["prompt"])] * 2 for r in rows], float)
    outputs = np.array([[estimate_tokens(r[f"{m}_response"]) for m in ROUTELLM_MODELS]
                        for r in rows], float)
    return Outcomes("routellm-gsm8k", tuple(f"gsm8k/{i}" for i in range(len(rows))),
                    tuple(regions.tolist()), ROUTELLM_MODELS, quality,
                    priced_costs(ROUTELLM_MODELS, inputs, outputs, prices), inputs, outputs)


def _assistant_answers(user_prompt: str) -> list[str]:
    """The assistant's answers quoted in a judge prompt (single- or multi-turn template)."""
    single = "[The Start of Assistant's Answer]"
    if single in user_prompt:
        return [user_prompt.split(single)[1].split("[The End of Assistant's Answer]")[0]
                .strip()]
    answers = []
    for part in user_prompt.split("### Assistant A:")[1:]:
        for stop in ("### User:", "<|The End of Assistant A's Conversation"):
            part = part.split(stop)[0]
        answers.append(part.strip())
    return answers


def mt_bench(*, prices: PriceTable | None = None) -> Outcomes:
    """RouteLLM's MT-bench judgements: 80 questions x 2 turns x 2 models, GPT-4 judge score
    1-10 mapped to quality ``(score - 1) / 9``. Regions ``category/turn<k>``; input tokens
    from the conversation so far, output tokens from the judged answer."""
    folder = "routellm/evals/mt_bench/"
    questions = {}
    for _, q in jsonl_rows(data.path("routellm", folder + "question.jsonl")):
        questions[q["question_id"]] = q
    cells: dict[tuple[int, int], dict[str, tuple[float, int, int]]] = {}
    for _, j in jsonl_rows(data.path("routellm", folder + "judgements.jsonl")):
        qid, turn = j["question_id"], j["turn"]
        answers = _assistant_answers(j["user_prompt"])
        if len(answers) < (1 if turn == 1 else 2):
            raise ValueError(f"judgement of question {qid} turn {turn}: no answer found")
        asked = " ".join(questions[qid]["turns"][:turn] + answers[:-1])
        answer = answers[-1]
        cells.setdefault((qid, turn), {})[j["model"]] = (
            (float(j["score"]) - 1.0) / 9.0, estimate_tokens(asked), estimate_tokens(answer))
    keys = sorted(k for k, v in cells.items() if set(ROUTELLM_MODELS) <= set(v))
    table = np.array([[cells[k][m] for m in ROUTELLM_MODELS] for k in keys])
    return Outcomes("mt-bench", tuple(f"{q}/turn{t}" for q, t in keys),
                    tuple(f"{questions[q]['category']}/turn{t}" for q, t in keys),
                    ROUTELLM_MODELS, np.clip(table[:, :, 0], 0, 1),
                    priced_costs(ROUTELLM_MODELS, table[:, :, 1], table[:, :, 2], prices),
                    table[:, :, 1], table[:, :, 2])


def _matrix(file: Path) -> tuple[list[str], dict[str, list[str]]]:
    opener = gzip.open if file.suffix == ".gz" else open
    try:
        with opener(file, "rt", newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            header = next(reader)[1:]
            return header, {row[0]: row[1:] for row in reader}
    except (EOFError, zlib.error, gzip.BadGzipFile, StopIteration) as error:
        raise ValueError(f"{file}: not a readable (gzip) CSV file ({error or 'empty'})"
                         ) from None


def alpaca_eval(*, models: Sequence[str] | None = None,
                prices: PriceTable | None = None) -> Outcomes:
    """AlpacaEval 2 preference matrix: quality = P(model preferred over gpt4_1106_preview)
    = preference - 1; regions = each instruction's source data set; cost from the output
    length (characters) and the instruction length, priced. Default models: those of the
    62 in the price table with no missing cell; queries with a missing cell are dropped."""
    prices = prices or PriceTable.default()
    folder = "alpaca_eval"
    instructions, prefs = _matrix(data.path(folder, "weighted_alpaca_eval_gpt4_turbo_"
                                                    "preference_matrix.csv"))
    length_header, lengths = _matrix(data.path(folder, "output_length_chars_matrix.csv"))
    if length_header != instructions:
        raise ValueError("preference and length matrices list different instructions")
    source = {}
    with gzip.open(data.path(folder, "annotations_long.csv.gz"), "rt", newline="",
                   encoding="utf-8-sig") as handle:
        for row in csv.DictReader(handle):
            source.setdefault(row["instruction"], row["dataset"])
    if models is None:
        models = [m for m in prefs if m in prices and "" not in prefs[m] and m in lengths]
    else:
        for m in models:
            prices.price(m)
            if m not in prefs or m not in lengths:
                raise KeyError(f"alpaca_eval has no preferences or lengths for {m!r}")
    rows = np.array([[np.nan if x == "" else float(x) for x in prefs[m]] for m in models]).T
    chars = np.array([[np.nan if x == "" else float(x) for x in lengths[m]] for m in models]).T
    keep = ~(np.isnan(rows).any(1) | np.isnan(chars).any(1))
    missing = [i for i in instructions if i not in source]
    if missing:
        raise ValueError(f"{len(missing)} instructions lack a source data set")
    inputs = np.array([[estimate_tokens(i)] * len(models) for i in instructions], float)
    outputs = np.ceil(np.nan_to_num(chars) / 4.0)
    notes = (f"dropped {int((~keep).sum())} instructions with a missing cell",)
    return Outcomes("alpaca-eval", tuple(f"alpaca/{i}" for i in np.flatnonzero(keep)),
                    tuple(source[instructions[i]] for i in np.flatnonzero(keep)),
                    tuple(models), np.clip(rows[keep] - 1.0, 0, 1),
                    priced_costs(models, inputs[keep], outputs[keep], prices),
                    inputs[keep], outputs[keep], notes)


def arena_bench(*, models: Sequence[str] | None = None,
                prices: PriceTable | None = None) -> Outcomes:
    """Arena-bench v1 (Arena-Hard-Auto): 15 models x 300 prompts, GPT-4 judge score 1-10 ->
    ``(score - 1) / 9``. The mirror holds neither prompt texts nor categories: one region
    (``arena``), and the constant token counts ``ARENA_INPUT_TOKENS`` /
    ``ARENA_OUTPUT_TOKENS`` (so cost differs by model only). Prompts with a missing
    score among the chosen models are dropped."""
    prompts, scores = _matrix(data.path("arena_bench_v1", "single_score_matrix.csv"))
    models = list(scores) if models is None else list(models)
    for m in models:
        if m not in scores:
            raise KeyError(f"arena_bench has no scores for {m!r}")
    table = np.array([[np.nan if x == "" else float(x) for x in scores[m]] for m in models]).T
    keep = ~np.isnan(table).any(1)
    n = int(keep.sum())
    inputs = np.full((n, len(models)), float(ARENA_INPUT_TOKENS))
    outputs = np.full((n, len(models)), float(ARENA_OUTPUT_TOKENS))
    return Outcomes("arena-bench", tuple(f"arena/{prompts[i]}" for i in np.flatnonzero(keep)),
                    ("arena",) * n, tuple(models), np.clip((table[keep] - 1) / 9, 0, 1),
                    priced_costs(models, inputs, outputs, prices), inputs, outputs,
                    (f"dropped {int((~keep).sum())} prompts with a missing score",))


DATASETS: dict[str, Callable[..., Outcomes]] = {
    "routellm-mmlu": routellm_mmlu,
    "routellm-gsm8k": routellm_gsm8k,
    "mt-bench": mt_bench,
    "alpaca-eval": alpaca_eval,
    "arena-bench": arena_bench,
}


def load(dataset: str, *, trust_pickle: bool = False, **options: object) -> Outcomes:
    """A registered data set by name (``DATASETS``, ``options`` go to its loader), or a
    file: ``.pkl``/``.pickle`` as RouterBench (read only with ``trust_pickle``: unpickling
    runs code), ``.csv``/``.jsonl`` as the long format."""
    if dataset in DATASETS:
        return DATASETS[dataset](**options)
    path = Path(dataset)
    if path.suffix.lower() in {".pkl", ".pickle"}:
        return read_routerbench(path, trust_pickle=trust_pickle, **options)
    if path.suffix.lower() in {".csv", ".jsonl", ".ndjson"}:
        return read_long(path, **options)
    raise KeyError(f"unknown data set {dataset!r}: give one of {', '.join(DATASETS)} or a "
                   ".csv/.jsonl/.pkl path")
