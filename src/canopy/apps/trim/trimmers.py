"""Trim levels (the arms of the trimming bandit): ways to shorten a few-shot prompt.

- ``full``: instruction and every worked example (the verbose default);
- ``shots<k>``: keep the first ``k`` examples (dropping few-shot examples; ``shots0`` is
  zero-shot);
- ``answers_only``: every example without its rationale;
- ``keep_first<T>`` / ``keep_last<T>``: positional truncation of the context so the whole
  prompt fits ``T`` tokens, keeping its beginning or its end;
- ``bm25_<T>``: retrieval-scored chunk selection, the examples ranked by BM25 against the
  question and kept best-first while the prompt fits ``T`` tokens;
- :class:`LLMLinguaTrimmer`: an adapter to LLMLingua (optional extra ``lingua``).

Token counts for trimming are estimates (:func:`approx_tokens`, characters / 4); the achieved
count is what the server reports, and the trimming run reports both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from canopy.errors import MissingExtra
from canopy.tasks.bbh import FewShotPrompt

__all__ = [
    "LLMLinguaTrimmer",
    "TrimLevel",
    "approx_tokens",
    "default_levels",
    "keep_first",
    "keep_last",
    "render_query",
    "select_chunks",
]

Counter = Callable[[str], int]


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate: one token per four characters."""
    return math.ceil(len(text) / 4)


def render_query(context: str, question: str) -> str:
    """The prompt sent to the model: the (trimmed) context, then the question."""
    head = f"{context}\n\n" if context else ""
    return f"{head}Q: {question}\nA:"


@dataclass(frozen=True)
class TrimLevel:
    """One arm: ``build(prompt, question)`` returns the trimmed context; ``requested_tokens``
    is the whole-prompt budget it aims at (``None`` for structural trims)."""

    name: str
    build: Callable[[FewShotPrompt, str], str]
    requested_tokens: int | None = None


def _join(instruction: str, blocks: Sequence[str]) -> str:
    return "\n\n".join(part for part in (instruction, *blocks) if part)


def _fit(budget: int, question: str, count: Counter) -> int:
    """Tokens left for the context: one less than the budget minus the bare query, for the
    blank line that joins them (with chars/4 the whole then fits the budget)."""
    room = budget - count(render_query("", question)) - 1
    return max(room, 0)


def _longest_fit(text: str, tokens: int, count: Counter, *, from_end: bool) -> str:
    """The longest run of whole words at the start (or end) of ``text`` within ``tokens``."""
    if count(text) <= tokens:
        return text
    words = re.split(r"(\s+)", text)

    def part(n: int) -> str:
        return "".join(words[len(words) - n:] if from_end else words[:n])

    low, high = 0, len(words)
    while low < high:  # binary search on the number of pieces kept
        middle = (low + high + 1) // 2
        if count(part(middle)) <= tokens:
            low = middle
        else:
            high = middle - 1
    return part(low).strip()


def keep_first(text: str, tokens: int, count: Counter = approx_tokens) -> str:
    """The longest prefix of ``text`` (cut at a word boundary) within ``tokens``."""
    return _longest_fit(text, tokens, count, from_end=False)


def keep_last(text: str, tokens: int, count: Counter = approx_tokens) -> str:
    """The longest suffix of ``text`` (cut at a word boundary) within ``tokens``."""
    return _longest_fit(text, tokens, count, from_end=True)


def select_chunks(chunks: Sequence[str], query: str, tokens: int,
                  count: Counter = approx_tokens) -> list[int]:
    """Indices of the chunks to keep: ranked by BM25 (Okapi) against ``query``, taken
    best-first while their total fits ``tokens``, returned in document order."""
    from rank_bm25 import BM25Okapi

    if not chunks:
        return []
    tokenise = lambda text: re.findall(r"\w+", text.lower())  # noqa: E731
    scores = BM25Okapi([tokenise(chunk) or ["_"] for chunk in chunks]).get_scores(
        tokenise(query))
    kept, used = [], 0
    for index in sorted(range(len(chunks)), key=lambda i: (-scores[i], i)):
        size = count(chunks[index]) + 1
        if used + size <= tokens:
            kept.append(index)
            used += size
    return sorted(kept)


def _shots(k: int) -> Callable[[FewShotPrompt, str], str]:
    return lambda prompt, question: _join(prompt.instruction,
                                          [s.render() for s in prompt.shots[:k]])


def _full(prompt: FewShotPrompt, question: str) -> str:
    return _join(prompt.instruction, [s.render() for s in prompt.shots])


def _answers_only(prompt: FewShotPrompt, question: str) -> str:
    return _join(prompt.instruction, [s.render(rationale=False) for s in prompt.shots])


def _truncate(budget: int, *, first: bool,
              count: Counter) -> Callable[[FewShotPrompt, str], str]:
    cut = keep_first if first else keep_last

    def build(prompt: FewShotPrompt, question: str) -> str:
        return cut(_full(prompt, question), _fit(budget, question, count), count)

    return build


def _bm25(budget: int, count: Counter) -> Callable[[FewShotPrompt, str], str]:
    def build(prompt: FewShotPrompt, question: str) -> str:
        room = _fit(budget, question, count) - count(prompt.instruction)
        blocks = [s.render() for s in prompt.shots]
        return _join(prompt.instruction,
                     [blocks[i] for i in select_chunks(blocks, question, room, count)])

    return build


def default_levels(*, budget_tokens: int = 320, count: Counter = approx_tokens,
                   shots: Sequence[int] = (2, 1, 0), answers_only: bool = True,
                   ) -> list[TrimLevel]:
    """The arms of the trimming runs: full, the first ``k`` examples for each ``k`` in
    ``shots`` (BBH's 3-shot prompts: 2, 1, 0; MMLU's 5-shot: 3, 1, 0), answers only (off
    where the examples carry no rationale, as MMLU's do not: it would repeat ``full``),
    positional truncation (both ends) and BM25 chunk selection at ``budget_tokens``."""
    if budget_tokens < 1:
        raise ValueError(f"budget_tokens must be >= 1, got {budget_tokens}")
    if any(k < 0 for k in shots) or len(set(shots)) != len(shots):
        raise ValueError(f"shots must be distinct counts >= 0, got {list(shots)}")
    return [
        TrimLevel("full", _full),
        *(TrimLevel(f"shots{k}", _shots(k)) for k in shots),
        *([TrimLevel("answers_only", _answers_only)] if answers_only else []),
        TrimLevel(f"keep_first{budget_tokens}", _truncate(budget_tokens, first=True,
                                                          count=count), budget_tokens),
        TrimLevel(f"keep_last{budget_tokens}", _truncate(budget_tokens, first=False,
                                                         count=count), budget_tokens),
        TrimLevel(f"bm25_{budget_tokens}", _bm25(budget_tokens, count), budget_tokens),
    ]


class LLMLinguaTrimmer:
    """Adapter to LLMLingua's ``PromptCompressor`` (``pip install 'canopy-bandits[lingua]'``).

    ``level(rate)`` is a :class:`TrimLevel` that hands LLMLingua the instruction and the worked
    examples as separate demonstrations (its coarse demonstration-level filter, then its
    token-level one) at about ``rate`` of their tokens; the question is passed for budgeting
    but not appended, since :func:`render_query` adds it. ``compressor`` reuses an already
    built ``PromptCompressor`` (or any object with its ``compress_prompt``); otherwise the
    package and its scorer model ``model_name`` load here. LLMLingua 0.2.2 needs
    ``transformers<4.47`` and fetches tiktoken's ``cl100k_base`` on construction (see
    docs/trim.md)."""

    def __init__(self, *, model_name: str | None = None, device_map: str = "cpu",
                 compressor: object | None = None) -> None:
        if compressor is None:
            try:
                from llmlingua import PromptCompressor
            except ImportError as error:
                raise MissingExtra("LLMLinguaTrimmer needs the optional package llmlingua: "
                                   "pip install 'canopy-bandits[lingua]'") from error
            kwargs = {"device_map": device_map}
            if model_name is not None:
                kwargs["model_name"] = model_name
            compressor = PromptCompressor(**kwargs)
        if not callable(getattr(compressor, "compress_prompt", None)):
            raise TypeError(f"compressor must have a compress_prompt method, got {compressor!r}")
        self._compressor = compressor

    def level(self, rate: float) -> TrimLevel:
        """The trim level compressing the worked examples to about ``rate`` of their tokens."""
        if not 0 < rate <= 1:
            raise ValueError(f"rate must be in (0, 1], got {rate}")

        def build(prompt: FewShotPrompt, question: str) -> str:
            result = self._compressor.compress_prompt(
                [shot.render() for shot in prompt.shots], instruction=prompt.instruction,
                question=question, rate=rate, concate_question=False)
            return str(result["compressed_prompt"]).strip()

        return TrimLevel(f"llmlingua{rate:g}", build)
