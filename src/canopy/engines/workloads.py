"""Live workloads: shared-prefix request streams made of words the model's tokenizer maps to
one token each (``" word"``), so text prefixes are token prefixes and a block of
``block_tokens`` words is a block of the engine. Sent to live engines by ``canopy cache live``
and ``canopy fleet bench``.

* ``zipf`` (:func:`zipf_workload`): ``systems`` system prompts, each with ``contexts``
  few-shot contexts (the shared prefix: system then context), chosen with Zipf popularity,
  then a question of fresh words. ``shift``: the second half of the stream draws from a
  disjoint set of prefixes (a popularity shift); only requests after it are counted.
* ``conversation`` / ``synthetic`` (:func:`mooncake_workload`): the prefix structure of the
  first requests of a Mooncake trace, each 512-token block of the trace replaced by
  ``block_tokens`` words derived from its hash (chains cut at ``max_blocks``), then a
  question.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SCENARIOS", "WORKLOADS", "Workload", "mooncake_workload", "word_vocabulary",
           "zipf_workload"]

SCENARIOS = ("stationary", "shift")
WORKLOADS = ("zipf", "conversation", "synthetic")


@dataclass(frozen=True)
class Workload:
    """Prompts (lists of one-token words) and the index of the first counted request."""

    name: str
    prompts: list[list[str]]
    start: int = 0

    def text(self, i: int) -> str:
        return "".join(" " + w for w in self.prompts[i])


def word_vocabulary(model_path: str | Path, *, limit: int = 4000) -> tuple[list[str], Any]:
    """Lower-case words the model's tokenizer maps to exactly one token with a leading space,
    and the vocabulary-only model (for tokenizing prompts as the engine does)."""
    from llama_cpp import Llama
    from llama_cpp._utils import suppress_stdout_stderr

    with suppress_stdout_stderr(disable=False):  # llama.cpp's context notes on stderr
        vocab = Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    words = []
    for token in range(vocab.n_vocab()):
        piece = vocab.detokenize([token])
        if re.fullmatch(rb" [a-z]{3,9}", piece) and vocab.tokenize(
                piece, add_bos=False) == [token]:
            words.append(piece[1:].decode())
            if len(words) == limit:
                break
    if len(words) < 100:
        raise ValueError(f"{model_path}: only {len(words)} single-token words in the vocabulary")
    return words, vocab


def _zipf_choice(rng: random.Random, n: int, exponent: float) -> int:
    weights = [1.0 / (rank + 1) ** exponent for rank in range(n)]
    return rng.choices(range(n), weights=weights)[0]


def zipf_workload(words: Sequence[str], *, requests: int = 80, scenario: str = "shift",
                  systems: int = 4, contexts: int = 6, system_tokens: int = 32,
                  context_tokens: int = 32, question_tokens: int = 12,
                  exponent: float = 1.0, seed: int = 0) -> Workload:
    """System prompt + few-shot context drawn with Zipf popularity, then a fresh question."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}, got {scenario!r}")
    rng = random.Random(seed)

    def pool() -> list[list[str]]:
        out = []
        for _ in range(systems):
            system = rng.choices(words, k=system_tokens)
            out += [system + rng.choices(words, k=context_tokens) for _ in range(contexts)]
        rng.shuffle(out)  # popularity rank independent of the system
        return out

    start = requests // 2 if scenario == "shift" else 0
    phases = [pool(), pool()] if scenario == "shift" else [pool()]
    prompts = []
    for i in range(requests):
        prefixes = phases[-1 if i >= start else 0]
        prefix = prefixes[_zipf_choice(rng, len(prefixes), exponent)]
        prompts.append(prefix + rng.choices(words, k=question_tokens))
    return Workload(f"zipf-{scenario}", prompts, start)


def mooncake_workload(words: Sequence[str], trace: str = "conversation", *, requests: int = 80,
                      scenario: str = "stationary", block_tokens: int = 16,
                      max_blocks: int = 6, question_tokens: int = 12,
                      seed: int = 0) -> Workload:
    """A Mooncake trace's prefix structure with text: each hash becomes ``block_tokens``
    words (the same words wherever the hash recurs). ``shift``: the first half of the
    requests, then the same requests under fresh words (a disjoint block space)."""
    from itertools import islice

    from canopy import data
    from canopy.prefix.traces import TRACE_FILES, iter_mooncake

    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}, got {scenario!r}")
    file = data.path("mooncake", TRACE_FILES[trace])
    start = requests // 2 if scenario == "shift" else 0
    counts = [start, requests - start] if scenario == "shift" else [requests]
    chains = [hashes[:max_blocks] for _, _, hashes in islice(iter_mooncake(file), max(counts))]
    rng = random.Random(seed)
    prompts = []
    for phase, count in enumerate(counts):
        for chain in chains[:count]:
            text = [w for h in chain for w in random.Random(f"{seed}:{phase}:{h}").choices(
                words, k=block_tokens)]
            prompts.append(text + rng.choices(words, k=question_tokens))
    return Workload(f"{trace}-{scenario}", prompts, start)


