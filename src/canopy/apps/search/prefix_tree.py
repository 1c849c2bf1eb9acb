"""The core library's tree realised as text, for value-guided search (paper Section 4,
"Test-time search").

The policy runs on a complete ``arity``-ary :class:`~canopy.tree.Tree` of ``depth`` levels
(heap layout: the children of node ``v`` are ``arity * v + 1 .. arity * v + arity``). Node
``(level, index)`` stands for a prefix of ``level`` reasoning lines:

- the root is the empty prefix;
- child ``j`` of a node is the ``j``-th *distinct* next line seen after its prefix. Lines come
  from every call already made from that prefix (the lines of rollouts that passed through it,
  and one-line steps); a step call is spent only when fewer than ``j + 1`` are known, so a
  node is materialised the first time the policy touches it, not before;
- a prefix whose text is a complete answer (a finished rollout, or a step whose line states
  the final answer, the task's ``final`` line: GSM8K's ``The answer is N``, MATH's
  ``\\boxed{...}``) is *terminal*: every node below it is that same complete answer, and
  materialising them costs nothing.

The adapter makes no calls itself: it asks the caller's ``step`` function for a line when it
needs one, and the caller files every rollout with :meth:`PrefixTree.record`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from canopy.apps.search.gsm8k import extract_answer, states_answer
from canopy.tree import Tree
from canopy.validation import check_count

__all__ = ["Completion", "PrefixTree"]


@dataclass(frozen=True)
class Completion:
    """A complete answer: its text below the prompt, final answer and cheap score."""

    text: str
    answer: str | None
    score: float


def lines_of(text: str, *, keep_indent: bool = False) -> list[str]:
    """The non-blank lines of ``text``, stripped (whitespace does not tell lines apart), or
    with their indentation kept (``keep_indent``: in code it is meaning)."""
    return [line.rstrip() if keep_indent else line.strip() for line in text.split("\n")
            if line.strip()]


class PrefixTree:
    """Node ``<->`` prefix mapping of a complete tree, grown on demand.

    Args:
        arity: children per node (distinct next lines kept per prefix), >= 2.
        depth: levels below the root; nodes at ``depth`` are the tree's leaves.
        step_tries: step calls spent at most on one missing child. A child whose tries all
            repeat a known line (or are blank) repeats the known line ``j mod n`` (its parent's
            prefix when no line is known): the tree keeps its shape, the duplicate is just a
            second copy of a sibling.
        keep_indent: keep each line's indentation (code) instead of stripping it (prose).
        final: whether a step's line ends the answer (default: it states ``The answer is``;
            for code, no line does: only a finished rollout is a complete program).
        answer_of: the final answer of a text that a step's final line completes (default:
            GSM8K's number).
    """

    def __init__(self, *, arity: int, depth: int, step_tries: int = 2,
                 keep_indent: bool = False, final: Callable[[str], bool] = states_answer,
                 answer_of: Callable[[str], str | None] = extract_answer) -> None:
        check_count(arity, "arity", low=2)
        check_count(depth, "depth")
        check_count(step_tries, "step_tries")
        self.tree = Tree.complete(arity, depth)
        self.arity, self.depth, self.step_tries = arity, depth, step_tries
        self.keep_indent, self._final, self._answer_of = keep_indent, final, answer_of
        self._prefix: dict[int, str] = {0: ""}
        self._next_lines: dict[str, list[str]] = {}
        self._complete: dict[str, Completion] = {}
        self._through: dict[str, list[Completion]] = {}

    # ------------------------------------------------------------------ node <-> cell
    def cell(self, node: int) -> tuple[int, int]:
        """``(level, index)`` of a node id."""
        level = int(self.tree.level[self.tree.check_node(node)])
        return level, node - (self.arity**level - 1) // (self.arity - 1)

    def node(self, cell: tuple[int, int]) -> int:
        """Node id of a ``(level, index)`` cell."""
        level, index = cell
        if not 0 <= level <= self.depth or not 0 <= index < self.arity**level:
            raise IndexError(f"cell {cell!r} is outside the tree")
        return (self.arity**level - 1) // (self.arity - 1) + index

    # ------------------------------------------------------------------ what is known
    def prefix(self, node: int) -> str | None:
        """The node's prefix (lines ending in ``\\n``), or ``None`` if not materialised."""
        return self._prefix.get(self.tree.check_node(node))

    def completion(self, prefix: str) -> Completion | None:
        """The complete answer a terminal prefix is, else ``None``."""
        return self._complete.get(prefix)

    def through(self, prefix: str) -> list[Completion]:
        """Every complete answer recorded whose text starts with ``prefix`` line by line."""
        return list(self._through.get(prefix, ()))

    def settled(self, node: int) -> Completion | None:
        """The complete answer ``node`` is known to be without any call: its prefix, or a
        materialised ancestor's, is terminal."""
        for ancestor in self._path(node):
            prefix = self._prefix.get(ancestor)
            if prefix is None:
                return None
            if self._terminal(prefix):
                return self._complete[prefix]
        return None

    def steps_needed(self, node: int) -> int:
        """Step calls that materialising ``node`` may need: one per missing line, counted
        before any call (fewer are spent when a new line ends in a final answer or earlier
        rollouts supply it; retries of repeated lines are not counted)."""
        missing = 0
        prefix: str | None = ""  # the ancestor's prefix as far as it is known without calls
        for ancestor in self._path(node)[1:]:
            if ancestor in self._prefix:
                prefix = self._prefix[ancestor]
                continue
            if prefix is not None and self._terminal(prefix):
                return missing  # below a terminal prefix nothing is missing
            known = self._next_lines.get(prefix, []) if prefix is not None else []
            slot = self._slot(ancestor)
            if slot < len(known):
                prefix = prefix + known[slot] + "\n"  # type: ignore[operator]
            else:
                missing += 1
                prefix = None
        return missing

    # ------------------------------------------------------------------ growing
    def materialise(self, node: int, step: Callable[[str], tuple[str, float]], *,
                    max_steps: int) -> str:
        """The prefix of ``node``, materialising its missing ancestors first.

        ``step(prefix)`` makes one step call and returns its line and cheap score (a line that
        states a final answer makes a terminal prefix with that score). At most ``max_steps``
        step calls are made; the caller must allow at least :meth:`steps_needed` of them
        (retries of repeated lines use whatever is left above that)."""
        need = self.steps_needed(node)
        if max_steps < need:
            raise ValueError(f"materialising node {node} needs {need} step calls, "
                             f"max_steps is {max_steps}")
        spare = max_steps - need
        for ancestor in self._path(node):
            if ancestor in self._prefix:
                continue
            parent = self._prefix[int(self.tree.parent[ancestor])]
            slot = self._slot(ancestor)
            known = self._next_lines.setdefault(parent, [])
            tries = 0
            while not self._terminal(parent) and len(known) <= slot and (
                    tries == 0 or (spare > 0 and tries < self.step_tries)):
                spare -= tries > 0
                tries += 1
                line, score = step(parent)
                if line.strip():
                    line = line.rstrip() if self.keep_indent else line.strip()
                    self._add_line(parent, line)
                    if self._final(line):
                        text = parent + line + "\n"
                        self._finish(text, Completion(text, self._answer_of(text), score))
            self._prefix[ancestor] = self._child_prefix(parent, slot)
        return self._prefix[node]

    def record(self, prefix: str, continuation: str, *, answer: str | None,
               score: float) -> Completion:
        """File a rollout from ``prefix``: its lines become known next lines along its path,
        its complete answer is recorded at every prefix it passes through, and its full text
        becomes a terminal prefix."""
        text = prefix
        path = [prefix]
        for line in lines_of(continuation, keep_indent=self.keep_indent):
            self._add_line(text, line)
            text += line + "\n"
            path.append(text)
        done = Completion(text, answer, float(score))
        self._finish(text, done, path[:-1])
        return done

    def plurality(self, prefix: str) -> str | None:
        """Most frequent final answer among the complete answers through ``prefix`` (``None``
        answers ignored); ties go to the higher mean score, then to the earlier answer."""
        answers = [c for c in self._through.get(prefix, ()) if c.answer is not None]
        if not answers:
            return None
        votes = Counter(c.answer for c in answers)
        scores: dict[str, list[float]] = {}
        for c in answers:
            scores.setdefault(c.answer, []).append(c.score)  # type: ignore[arg-type]
        return max(votes, key=lambda a: (votes[a], sum(scores[a]) / len(scores[a])))

    # ------------------------------------------------------------------ internals
    def _path(self, node: int) -> list[int]:
        return self.tree.path_to_root(self.tree.check_node(node))[::-1]

    def _slot(self, node: int) -> int:
        """Which child of its parent ``node`` is (heap layout)."""
        return node - (self.arity * int(self.tree.parent[node]) + 1)

    def _terminal(self, prefix: str) -> bool:
        return prefix in self._complete

    def _add_line(self, prefix: str, line: str) -> None:
        known = self._next_lines.setdefault(prefix, [])
        if line not in known:
            known.append(line)

    def _child_prefix(self, parent: str, slot: int) -> str:
        if self._terminal(parent):
            return parent
        known = self._next_lines.get(parent, [])
        return parent + known[slot % len(known)] + "\n" if known else parent

    def _finish(self, text: str, done: Completion, path: list[str] | None = None) -> None:
        self._complete.setdefault(text, done)
        if path is None:  # a step's final line: the prefixes above it
            lines = lines_of(text, keep_indent=self.keep_indent)
            path = ["".join(f"{line}\n" for line in lines[:i]) for i in range(len(lines))]
        for prefix in [*path, text]:
            self._through.setdefault(prefix, []).append(done)


