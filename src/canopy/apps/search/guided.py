"""Value-guided test-time search: the core library's optimistic descent (paper Section 3.2,
Eqs. 4-6) chooses which prefix of a reasoning chain to extend, probe or complete, under a
budget in generation calls (Section 4, "Test-time search").

The tree is a :class:`~canopy.apps.search.prefix_tree.PrefixTree` (a complete tree realised
as text on demand) and the policy a :class:`~canopy.policies.OptimisticDescent` driven
through its ask/tell surface:

- *probe* of node ``v`` (cost 1 call): one rollout from ``v``'s prefix to a complete answer,
  a random leaf below ``v`` as in Eq. (1); its value is the cheap score of that answer, the
  geometric-mean token probability of the rollout ``exp(mean log p)`` in ``[0, 1]``
  (stationary, no ground truth). A terminal prefix is already a complete answer: its probe
  re-reads its score and makes no call.
- *evaluation* of leaf ``x`` (cost ``1 + k`` calls): ``x``'s complete answer (one rollout
  from its prefix, made once per leaf) graded by self-consistency: the share of ``k`` fresh
  rollouts from the question whose final answer equals it.
- materialising a node's prefix costs step calls (one line each) where earlier rollouts have
  not supplied the line.

The session's :class:`~canopy.problem.Ledger` is the truth for the budget: before a query
runs, the steps it may need plus its own calls must be affordable, else the search stops.
The policy's own ledger counts nominal costs; it gets ``free_rounds`` on top of the call
budget for the queries a terminal prefix answers without a call (re-reading a known score),
which would otherwise eat the call budget; that allowance also bounds the loop.
The answer: the policy's recommended leaf, walked up to the deepest materialised node with
complete answers through it; the plurality of those answers (ties to the higher mean score).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Protocol

from canopy.apps.search.config import SearchConfig
from canopy.apps.search.prefix_tree import Completion, PrefixTree
from canopy.policies.descent import OptimisticDescent
from canopy.problem import Ledger, ProblemSpec, Query

__all__ = ["Sample", "Sampler", "guided_spec", "value_guided"]


class Sample(Protocol):
    """One completion as the search scores it: its text, mean token log-probability and final
    answer (``None`` when it states none)."""

    text: str
    logprob: float
    answer: str | None


class Sampler(Protocol):
    """What the search needs of a session: rollouts, steps, the call ledger, and the task's
    final answer of a text and its test of a line that ends an answer."""

    ledger: Ledger
    seed: int
    config: SearchConfig
    answer_of: Callable[[str], str | None]
    final: Callable[[str], bool]

    def rollout(self, prefix: str, seed: int) -> Sample: ...

    def step(self, prefix: str, seed: int) -> Sample: ...


def guided_spec(shape: PrefixTree, config: SearchConfig, *, leaf_calls: int | None = None
                ) -> ProblemSpec:
    """The multi-fidelity problem the policy sees: costs in calls, scores in ``[0, 1]``; a
    leaf evaluation costs its rollout plus ``leaf_calls`` (default: the agreement
    rollouts)."""
    extra = config.agreement if leaf_calls is None else leaf_calls
    return ProblemSpec(shape.tree, sigma=config.score_sigma, probe_cost=1.0,
                       leaf_cost=1.0 + extra, value_range=(0.0, 1.0))


def value_guided(session: Sampler, *, probe_score: Callable[[Sample], float] | None = None,
                 leaf_value: Callable[[Completion], float] | None = None,
                 code: bool = False) -> str | None:
    """Run the search on one question with ``session.config`` until the policy or the
    session's budget stops it; return the final answer (``None`` if none was reached).

    By default a probe scores a rollout by its geometric-mean token probability and a leaf
    is graded by agreement; ``probe_score`` and ``leaf_value`` replace them (code search:
    the partial and the full tests, no extra calls), and ``code`` keeps indentation, lets
    only finished rollouts end an answer, and answers with the best-probed program rather
    than a plurality of texts."""
    config = session.config
    shape = PrefixTree(arity=config.branching, depth=config.max_depth,
                       step_tries=config.step_tries, keep_indent=code,
                       final=(lambda line: False) if code else session.final,
                       answer_of=session.answer_of)
    score = probe_score or (lambda sample: math.exp(sample.logprob))
    agreement = 0 if leaf_value is not None else config.agreement
    policy = OptimisticDescent(spread=config.spread, lipschitz=config.lipschitz,
                               c=config.exploration)
    policy.start(guided_spec(shape, config, leaf_calls=agreement),
                 budget=session.ledger.budget + config.free_rounds, seed=session.seed)
    seeds = itertools.count()
    leaf_answers: dict[int, Completion] = {}

    def rollout(prefix: str) -> Completion:
        sample = session.rollout(prefix, seed=next(seeds))
        return shape.record(prefix, sample.text, answer=sample.answer, score=score(sample))

    def step(prefix: str) -> tuple[str, float]:
        sample = session.step(prefix, seed=next(seeds))
        return sample.text.split("\n", 1)[0], math.exp(sample.logprob)

    while (query := policy.ask()) is not None:
        node = int(query.node)
        known = shape.settled(node) or leaf_answers.get(node)
        calls = (0 if known is not None else 1) + (agreement if query.kind == "leaf" else 0)
        if not session.ledger.can_afford(shape.steps_needed(node) + calls):
            break
        spare = math.floor(session.ledger.remaining + 1e-9) - calls
        prefix = shape.materialise(node, step, max_steps=spare)
        done = shape.completion(prefix) or leaf_answers.get(node) or rollout(prefix)
        policy.tell(query, leaf_value(done) if leaf_value is not None and
                    query.kind == "leaf" else _value(query, done, rollout, agreement))
        if query.kind == "leaf":
            leaf_answers[node] = done
    return _answer(shape, policy, by_score=code)


def _value(query: Query, done: Completion, rollout: Callable[[str], Completion],
           agreement: int) -> float:
    if query.kind == "probe":
        return done.score
    if done.answer is None:
        return 0.0  # nothing to agree with: no reference rollouts are spent
    return sum(rollout("").answer == done.answer for _ in range(agreement)) / agreement


def _answer(shape: PrefixTree, policy: OptimisticDescent, *, by_score: bool = False
            ) -> str | None:
    """The answer at the recommended leaf's deepest materialised node: the plurality of the
    complete answers through it, or with ``by_score`` (programs, whose texts rarely repeat)
    the one with the best probe score (the earliest on ties)."""
    leaf = int(shape.tree.leaf_node[int(policy.recommend(1)[0])])
    for node in shape.tree.path_to_root(leaf):  # deepest first
        prefix = shape.prefix(node)
        if prefix is not None and (candidates := shape.through(prefix)):
            if by_score:
                return max(candidates, key=lambda done: done.score).answer
            return shape.plurality(prefix)
    return None
