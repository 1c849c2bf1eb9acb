"""The settings of a live test-time search (:mod:`canopy.apps.search.live`): sampling, beam
search, and the value-guided search of :mod:`canopy.apps.search.guided`, which both read it."""

from __future__ import annotations

from dataclasses import dataclass

from canopy.apps.search.gsm8k import CHATML
from canopy.validation import check_count, check_nonnegative, check_positive

__all__ = ["SearchConfig"]


@dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """Sampling and search settings (keyword-only)."""

    temperature: float = 0.8
    max_tokens: int = 192
    step_tokens: int = 48
    beam_width: int = 2
    beam_expand: int = 2
    template: str = CHATML
    system: str | None = None  # None: the task's system prompt
    # value-guided search (canopy.apps.search.guided)
    branching: int = 2  # distinct next lines per prefix (the tree's arity)
    max_depth: int = 4  # lines of a prefix at the tree's leaves
    step_tries: int = 2  # step calls at most per missing child
    agreement: int = 2  # k: fresh rollouts grading a leaf (leaf cost 1 + k calls)
    spread: str = "assumed"  # OptimisticDescent's bias bonus
    lipschitz: float = 0.3  # L of the floor L rho^level, in score units
    exploration: float = 0.1  # c of Eq. (4)'s radius, in score units
    score_sigma: float = 0.1  # noise sd of one rollout's score (ProblemSpec.sigma)
    free_rounds: int = 1024  # queries a terminal prefix answers without a call, at most

    def __post_init__(self) -> None:
        for name in ("max_tokens", "step_tokens", "branching", "max_depth", "beam_width",
                     "beam_expand", "step_tries", "agreement", "free_rounds"):
            check_count(getattr(self, name), name, low=2 if name == "branching" else 1)
        check_nonnegative(self.temperature, "temperature")
        for name in ("exploration", "lipschitz", "score_sigma"):
            check_positive(getattr(self, name), name)
        if self.spread not in ("assumed", "estimated", "certified", "hybrid"):
            raise ValueError(f"spread must be 'assumed', 'estimated', 'certified' or "
                             f"'hybrid', got {self.spread!r}")
