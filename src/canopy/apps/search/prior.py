"""Measuring the prior (paper Section 4, "Measuring the prior"; Table 7): log
each node's cheap probe and its graded truth, and ask how tree-Lipschitz the value function is.

A log row is one rollout from a node: ``{"tree", "node", "parent", "depth", "probe",
"truth"}`` (``tree`` names the question, ``node``/``parent`` are ids within it, ``probe`` is
the rollout's cheap score, ``truth`` its graded value). A node's cheap value and true value
are the means of its rows. From those, over the logged nodes and steps (a *step* is a node
with at least two logged children):

- probe-vs-truth Spearman and Pearson correlation over nodes (the smooth backbone);
- the edge-following hit rate: at each step, whether the child with the highest cheap value
  is one of the children with the highest true value, over all steps and over pivotal steps
  only, each with its chance rate (the share of best children, averaged) and, for pivotal
  steps, a Wilson interval;
- the mean true value lost per step (best child's truth minus the probe-chosen child's);
- the pivotal-step fraction at each ``tau``: steps whose children's true values spread by at
  least ``tau`` (max minus min), the violations ``K`` of the prior.

:func:`expand_tree` produces such a log for one question by expanding every node of a prefix
tree breadth-first (``branching`` distinct next steps per node, ``rollouts`` rollouts from
each), so the measurement does not depend on where a policy chose to go.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from canopy.data import bad_line, jsonl_rows
from canopy.stats import wilson_interval
from canopy.validation import check_count, check_number

__all__ = ["LogRow", "analyse", "expand_tree", "llm_tree", "log_prior", "prior_items",
           "read_log", "write_log"]

TAUS = (0.25, 0.5, 0.75)


@dataclass(frozen=True)
class LogRow:
    """One rollout from a node, with its cheap score and its graded truth."""

    tree: str
    node: int
    parent: int | None
    depth: int
    probe: float
    truth: float


def write_log(rows: Iterable[LogRow], path: str | Path) -> None:
    """Write rows as JSON lines."""
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(asdict(row)) + "\n")


MAX_LOG_BYTES = 64 * 2**20
"""A prior log above this size is refused (``CANOPY_MAX_INPUT_MB`` raises the cap)."""


def _whole(raw: dict[str, Any], key: str, *, none: bool = False) -> int | None:
    if key not in raw:
        raise ValueError(f"{key} is missing")
    value = raw[key]
    return None if value is None and none else check_count(value, key, low=0)


def _score(raw: dict[str, Any], key: str) -> float:
    return check_number(raw.get(key), key)


def read_log(path: str | Path) -> list[LogRow]:
    """Read a log written by :func:`write_log` (or any JSONL with those fields). A malformed
    line raises ``ValueError`` naming it; so does a log whose tree is not one: a node logged
    with two parents or depths, a parent that is not logged, or a depth that is not its
    parent's plus one (which rules out cycles); a root has no parent and depth 0."""
    rows = []
    seen: dict[tuple[str, int], tuple[int | None, int, int]] = {}
    for number, raw in jsonl_rows(path, max_bytes=MAX_LOG_BYTES, what="prior log"):
        try:
            if not isinstance(raw.get("tree"), (str, int)) or isinstance(raw["tree"], bool):
                raise ValueError(f"tree must be a string, got {raw.get('tree')!r}")
            row = LogRow(str(raw["tree"]), _whole(raw, "node"),  # type: ignore[arg-type]
                         _whole(raw, "parent", none=True), _whole(raw, "depth"),  # type: ignore[arg-type]
                         _score(raw, "probe"), _score(raw, "truth"))
        except (TypeError, ValueError) as error:
            raise bad_line(path, number, f"not a prior-log row: {error}") from None
        if (row.parent is None) != (row.depth == 0):
            raise bad_line(path, number, "a node has a parent exactly when its depth is > 0")
        first = seen.setdefault((row.tree, row.node), (row.parent, row.depth, number))
        if first[:2] != (row.parent, row.depth):
            raise bad_line(path, number, f"node {row.node} of tree {row.tree!r} was logged "
                                         f"on line {first[2]} with parent {first[0]} and "
                                         f"depth {first[1]}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no rows")
    for (tree, node), (parent, depth, number) in seen.items():
        if parent is None:
            continue
        above = seen.get((tree, parent))
        if above is None:
            raise bad_line(path, number, f"node {node} of tree {tree!r} names parent "
                                         f"{parent}, which is not logged")
        if above[1] != depth - 1:
            raise bad_line(path, number, f"node {node} of tree {tree!r} is at depth {depth} "
                                         f"under parent {parent} at depth {above[1]} (a "
                                         "cycle or a broken tree)")
    return rows


def _nodes(rows: Sequence[LogRow]) -> dict[tuple[str, int], dict[str, Any]]:
    nodes: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        node = nodes.setdefault((row.tree, row.node), {"parent": row.parent, "probe": [],
                                                      "truth": []})
        node["probe"].append(row.probe)
        node["truth"].append(row.truth)
    return {key: {"parent": n["parent"], "probe": float(np.mean(n["probe"])),
                  "truth": float(np.mean(n["truth"]))} for key, n in nodes.items()}


def analyse(rows: Sequence[LogRow], *, taus: Sequence[float] = TAUS) -> dict[str, Any]:
    """The prior's measurements (see the module docstring) from logged rows."""
    from scipy import stats

    if not rows:
        raise ValueError("no rows to analyse")
    nodes = _nodes(rows)
    probe = np.array([n["probe"] for n in nodes.values()])
    truth = np.array([n["truth"] for n in nodes.values()])
    constant = np.ptp(probe) == 0 or np.ptp(truth) == 0
    children: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for (tree, _), node in nodes.items():
        if node["parent"] is not None:
            children.setdefault((tree, node["parent"]), []).append(node)
    steps = [kids for kids in children.values() if len(kids) >= 2]
    hits, chance, lost, spread = [], [], [], []
    for kids in steps:
        true = np.array([k["truth"] for k in kids])
        cheap = np.array([k["probe"] for k in kids])
        best = np.isclose(true, true.max())
        chosen = int(np.argmax(cheap))
        hits.append(bool(best[chosen]))
        chance.append(float(best.mean()))
        lost.append(float(true.max() - true[chosen]))
        spread.append(float(true.max() - true.min()))
    hits_a, chance_a, spread_a = np.array(hits), np.array(chance), np.array(spread)
    pivotal = {}
    for tau in taus:
        mask = spread_a >= tau
        n = int(mask.sum())
        entry: dict[str, Any] = {"fraction": float(mask.mean()) if steps else None,
                                 "steps": n}
        if n:
            low, high = wilson_interval(float(hits_a[mask].sum()), n)
            entry |= {"hit_rate": float(hits_a[mask].mean()), "hit_rate_ci": [low, high],
                      "chance": float(chance_a[mask].mean())}
        pivotal[f"{tau:g}"] = entry
    return {
        "trees": len({row.tree for row in rows}), "nodes": len(nodes), "rows": len(rows),
        "steps": len(steps),
        "spearman": None if constant else float(stats.spearmanr(probe, truth).statistic),
        "pearson": None if constant else float(stats.pearsonr(probe, truth).statistic),
        "hit_rate": float(hits_a.mean()) if steps else None,
        "hit_rate_chance": float(chance_a.mean()) if steps else None,
        "value_lost_per_step": float(np.mean(lost)) if steps else None,
        "pivotal": pivotal,
    }


Rollout = Callable[[str, int], tuple[float, float]]  # (prefix, seed) -> (probe, truth)
Step = Callable[[str, int], str | None]  # (prefix, seed) -> the next line, None at the end


def expand_tree(tree: str, rollout: Rollout, step: Step, *, branching: int = 3,
                depth: int = 2, rollouts: int = 2, step_tries: int = 3) -> list[LogRow]:
    """Log ``rollouts`` rollouts from every node of a prefix tree of ``depth`` levels whose
    nodes have up to ``branching`` distinct next lines (``step_tries`` step calls per child
    at most; a prefix whose steps end or repeat gets fewer children)."""
    branching, depth = check_count(branching, "branching"), check_count(depth, "depth", low=0)
    rollouts, step_tries = check_count(rollouts, "rollouts"), check_count(step_tries, "step_tries")
    rows: list[LogRow] = []
    frontier = [(0, None, "")]
    next_id, seed = 1, 0
    for level in range(depth + 1):
        expanded = []
        for node, parent, prefix in frontier:
            for _ in range(rollouts):
                probe, truth = rollout(prefix, seed)
                seed += 1
                rows.append(LogRow(tree, node, parent, level, probe, truth))
            if level == depth:
                continue
            lines: list[str] = []
            for _ in range(branching * step_tries):
                if len(lines) == branching:
                    break
                line = step(prefix, seed)
                seed += 1
                if line is not None and line.strip() and line not in lines:
                    lines.append(line)
            for line in lines:
                expanded.append((next_id, node, prefix + line + "\n"))
                next_id += 1
        frontier = expanded
    return rows


Grade = Callable[[str, float], tuple[float, float]]  # (answer text, mean logprob) -> probe, truth


def llm_tree(client: Any, tree: str, prompt: str, grade: Grade, *, stop: Sequence[str],
             temperature: float = 0.8, max_tokens: int = 192, step_tokens: int = 48,
             branching: int = 3, depth: int = 2, rollouts: int = 2,
             seed: int = 0) -> list[LogRow]:
    """:func:`expand_tree` on an :class:`~canopy.llm.LLMClient`: a rollout completes
    ``prompt + prefix`` and ``grade`` scores the answer (the prefix plus the completion) from
    its text and mean token log-probability; a step is one more line."""
    from canopy.apps.search.live import _mean_logprob

    def rollout(prefix: str, call: int) -> tuple[float, float]:
        reply = client.complete(prompt + prefix, max_tokens=max_tokens,
                                temperature=temperature, seed=seed + call, stop=list(stop),
                                logprobs=1)
        return grade(prefix + reply.text, _mean_logprob(reply.raw))

    def step(prefix: str, call: int) -> str | None:
        reply = client.complete(prompt + prefix, max_tokens=step_tokens,
                                temperature=temperature, seed=seed + call,
                                stop=["\n", *stop])
        line = reply.text.split("\n", 1)[0]
        return line if line.strip() else None

    return expand_tree(tree, rollout, step, branching=branching, depth=depth,
                       rollouts=rollouts)


def prior_items(dataset: str, *, n: int, offset: int = 0) -> list[Any]:
    """The questions (``gsm8k``, ``bbh:<task>``) or code tasks (``humaneval``, ``mbpp``,
    ``arith:<level>``) :func:`log_prior` runs on, loaded before any call (a missing data set
    fails first)."""
    if dataset == "gsm8k":
        from canopy import data
        from canopy.apps.search.gsm8k import load_gsm8k

        return load_gsm8k(data.path("gsm8k", "test.jsonl"), n=n, offset=offset)
    if dataset.startswith("bbh:"):
        from canopy import data
        from canopy.tasks.bbh import load_task

        fewshot, questions = load_task(data.path("bbh"), dataset.split(":", 1)[1], n=n,
                                       offset=offset)
        return [(fewshot, item) for item in questions]
    if dataset in ("humaneval", "mbpp") or dataset.startswith("arith:"):
        from canopy.apps.search.code import load_code_tasks

        return load_code_tasks(dataset, n=n, offset=offset)
    raise ValueError(f"dataset must be gsm8k, bbh:<task>, humaneval, mbpp or arith:<level>, "
                     f"got {dataset!r}")


def log_prior(client: Any, dataset: str, items: Sequence[Any], *,
              progress: Callable[[int, int], None] | None = None,
              **config: Any) -> list[LogRow]:
    """The prior-tree logs of ``items`` (from :func:`prior_items`): ``gsm8k`` (probe: the
    rollout's geometric-mean token probability, the guided search's cheap score; truth: its
    answer is right; ``bbh:<task>`` alike, with the task's 3-shot chain-of-thought prompt),
    ``humaneval``, ``mbpp`` or ``arith:<level>`` (probe: the share of the
    partial tests a rollout's program passes; truth: the share of all tests). ``config``
    goes to :func:`llm_tree`."""
    rows: list[LogRow] = []
    for i, item in enumerate(items):
        if dataset == "gsm8k":
            from canopy.apps.search.gsm8k import extract_answer, is_correct, render_prompt
            from canopy.apps.search.live import _STOP

            def grade_answer(text: str, logprob: float, q: Any = item
                             ) -> tuple[float, float]:
                return math.exp(logprob), float(is_correct(extract_answer(text), q))

            rows += llm_tree(client, f"gsm8k/{i}", render_prompt(item.text), grade_answer,
                             stop=_STOP, **config)
        elif dataset.startswith("bbh:"):
            from canopy.tasks.bbh import cot_prompt, grade

            fewshot, question = item

            def grade_reasoning(text: str, logprob: float, q: Any = question
                                ) -> tuple[float, float]:
                return math.exp(logprob), float(grade(text, q))

            rows += llm_tree(client, f"{dataset}/{i}", cot_prompt(fewshot, question.question),
                             grade_reasoning, stop=["\n\nQ:", "\nQ:"], **config)
        else:
            from canopy.apps.search.code import STOP, pass_rate, program

            def grade_program(text: str, logprob: float, t: Any = item
                              ) -> tuple[float, float]:
                source = program(t, text)
                return pass_rate(source, t.probe_tests), pass_rate(source, t.tests)

            rows += llm_tree(client, item.task_id, item.prompt, grade_program, stop=STOP,
                             **config)
        if progress is not None:
            progress(i + 1, len(items))
    return rows
