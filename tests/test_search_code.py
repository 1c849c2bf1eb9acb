"""Code search with an execution probe (issue 14 item 2): pass@k, the selectors on scripted
samples, and one short live run against the real SmolLM2 server."""

from __future__ import annotations

import math

import numpy as np
import pytest

from canopy.apps.search.code import CodeTask
from canopy.apps.search.codesearch import _Grader, _Sample, _sampled, pass_at_k

TASK = CodeTask("toy/1", '"""\nReturn x doubled.\n"""\n', ("assert double(2) == 4",
                "assert double(-1) == -2", "assert double(0) == 0"),
                ("assert double(2) == 4",), "def double(x):\n    return 2 * x\n",
                ("double(2)",))


def test_pass_at_k_matches_its_definition():
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(4, 2, 3) == 1.0  # any 3 of 4 include a passing one
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - math.comb(7, 2) / math.comb(10, 2))
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


class _Scripted:
    """Stands in for a session: rollouts hand out fixed programs (a unit-test fake)."""

    def __init__(self, programs: list[str]) -> None:
        self.programs, self.tokens = programs, 0

    def rollout(self, prefix: str, seed: int) -> _Sample:
        self.tokens += 10
        return _Sample("", -float(seed), self.programs[seed], 10)


def test_best_of_n_takes_the_probe_and_majority_the_largest_behaviour():
    wrong = "def double(x):\n    return x + 2\n"  # passes the probe (2 -> 4), fails the rest
    right = "def double(x):\n    return x * 2\n"
    broken = "def double(x):\n    return None\n"
    grader = _Grader(TASK)
    picks, programs = _sampled(_Scripted([broken, wrong, right, broken, broken]), grader, 5)
    assert picks["first"][0] == broken
    assert picks["best_of_n"][0] == wrong  # ties on the probe go to the higher likelihood
    assert picks["majority"][0] == broken  # three programs answer double(2) with None
    crash = "def other(x):\n    return x\n"  # never defines double: no vote
    picks, _ = _sampled(_Scripted([crash, crash, right, crash, wrong]), grader, 5)
    assert picks["majority"][0] == right  # right and wrong agree on double(2): one cluster
    assert [grader.passes(p) for p in programs].count(True) == 1
    assert picks["best_of_n"][1:] == (5, 50) and picks["first"][1:] == (1, 10)


def test_a_short_live_code_search(tmp_path, llm_server, data_file):
    data_file("mbpp", "mbpp.jsonl")
    from canopy.apps.search.code import load_code_tasks
    from canopy.apps.search.codesearch import CODE_METHODS, run_code_search
    from canopy.apps.search.live import SearchConfig
    from canopy.llm import LLMClient

    client = LLMClient(llm_server.base_url, model=llm_server.model, api_key_env=None,
                       timeout=120.0, cache_dir=tmp_path / "cache")
    result, reach = run_code_search(client, load_code_tasks("mbpp", n=1), budgets=[3],
                                    config=SearchConfig(max_tokens=64, step_tokens=24))
    client.close()
    assert result.completed == 1 and result.error is None
    for method in CODE_METHODS:
        assert set(np.unique(result.correct[method])) <= {0.0, 1.0}
        assert result.calls[method][0, 0] <= 3
    assert set(reach) == {"pass@1", "pass@3"} and 0 <= reach["pass@1"] <= reach["pass@3"] <= 1
    rows = result.rows()
    assert {row["method"] for row in rows} == set(CODE_METHODS)
