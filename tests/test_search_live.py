"""Live search on a handful of GSM8K questions against the SmolLM2-135M llama-cpp server, and
the failure paths of a run (scripted server errors mid-run, a budget of zero)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from canopy.apps.search.gsm8k import Question, extract_answer, load_gsm8k
from canopy.apps.search.live import LIVE_METHODS, SearchConfig, run_search
from canopy.llm import LLMClient

SMALL = SearchConfig(max_tokens=32, step_tokens=16, temperature=0.8)


@pytest.mark.live
def test_live_search_spends_within_budget_and_reruns_from_cache(llm_server, data_file,
                                                                tmp_path):
    questions = load_gsm8k(data_file("gsm8k", "test.jsonl"), n=1)
    kwargs = {"model": llm_server.model, "api_key_env": None, "cache_dir": tmp_path,
              "timeout": 120.0}
    with LLMClient(llm_server.base_url, **kwargs) as client:
        first = run_search(client, questions, budgets=[3], config=SMALL, seed=0)
        fresh_calls = client.usage.calls
    assert first.error is None and first.completed == 1
    for method in LIVE_METHODS:
        assert np.all(first.calls[method] <= 3), method
        assert np.all(first.tokens[method] > 0), method
    assert first.calls["first"][0, 0] == 1
    # a root rollout, a rollout below its first line, then the second child's step and
    # rollout (2 calls) no longer fit: the search stops cleanly at 2 or 3 calls
    assert 2 <= first.calls["value_guided"][0, 0] <= 3
    # best-of-N's rollouts from the empty prefix are shared: fewer HTTP calls than charged
    charged = sum(first.calls[m][0].sum() for m in ("best_of_n", "beam", "value_guided"))
    assert fresh_calls < charged
    rows = first.rows()
    assert len(rows) == len(LIVE_METHODS)

    before = llm_server.request_count
    with LLMClient(llm_server.base_url, **kwargs) as client:
        again = run_search(client, questions, budgets=[3], config=SMALL, seed=0)
        assert client.usage.calls == 0 and client.usage.cache_hits > 0
    assert llm_server.request_count == before  # the rerun reached the server zero times
    for method in LIVE_METHODS:
        np.testing.assert_array_equal(first.correct[method], again.correct[method])
        assert first.answers[method] == again.answers[method]


def test_server_error_mid_run_stops_cleanly_and_keeps_finished_questions(scripted_server):
    # the first 7 requests answer, then the server fails for good
    scripted_server.routes["/v1/completions"] = lambda n: (
        (200, scripted_server.completion_body("3 + 4 = 7\nThe answer is 7."), 0.0) if n < 7
        else (500, b"down", 0.0))
    questions = [Question("What is 3 + 4?", "7"), Question("What is 2 + 2?", "4")]
    client = LLMClient(scripted_server.url("/v1"), model="m", max_retries=0)
    result = run_search(client, questions, budgets=[2], methods=["majority", "value_guided"],
                        config=SMALL)
    assert result.completed == 1 and "question 1" in result.error and "HTTP 500" in result.error
    assert result.correct["majority"][0, 0] == 1.0
    assert np.isnan(result.correct["majority"][0, 1])
    rows = result.rows()
    assert rows and all(row["questions"] == 1 for row in rows)


def test_zero_budget_and_bad_methods_are_rejected_before_any_call(scripted_server):
    client = LLMClient(scripted_server.url("/v1"), model="m")
    questions = [Question("q", "1")]
    with pytest.raises(ValueError, match="budgets"):
        run_search(client, questions, budgets=[0])
    with pytest.raises(ValueError, match="unknown methods"):
        run_search(client, questions, budgets=[2], methods=["magic"])
    with pytest.raises(ValueError, match="max_tokens"):
        SearchConfig(max_tokens=0)
    assert sum(scripted_server.counts.values()) == 0


def test_answer_extraction():
    assert extract_answer("so 5 + 2 = 7. The answer is 1,234.") == "1234"
    assert extract_answer("We get 12 apples, then 15.") == "15"
    assert extract_answer("no digits here") is None
    assert extract_answer("The answer is $18.00") == "18"


def test_value_guided_concentrates_calls_under_the_better_scored_prefix(scripted_server):
    """Two first steps over real HTTP: rollouts below step A have token probability 0.8 and
    agree on 5; below step B they have 0.2 and scatter. The core policy's descent should send
    most rollouts below A, and answer 5."""

    def reply(n):
        body = scripted_server.bodies[-1]
        prefix = body["prompt"].split("assistant\n", 1)[1]
        if "\n" in body["stop"]:
            text = "Step A"
        elif prefix.startswith("Step A"):
            text = "Then 5.\nThe answer is 5."
        elif prefix.startswith("Step B"):
            text = f"Then {n}.\nThe answer is {n}."
        else:
            text = "Step B\nThe answer is 9."
        logprob = math.log(0.8 if "Step A" in prefix + text else 0.2)
        return 200, scripted_server.completion_body(text, token_logprobs=(logprob,)), 0.0

    scripted_server.routes["/v1/completions"] = reply
    client = LLMClient(scripted_server.url("/v1"), model="m")
    result = run_search(client, [Question("q", "5")], budgets=[16],
                        methods=["value_guided"], config=SearchConfig(max_depth=3))
    bodies = scripted_server.bodies
    rollouts = [b["prompt"].split("assistant\n", 1)[1] for b in bodies if "\n" not in b["stop"]]
    below_a = sum(p.startswith("Step A") for p in rollouts)
    below_b = sum(p.startswith("Step B") for p in rollouts)
    assert len(bodies) == result.calls["value_guided"][0, 0] <= 16
    assert below_a >= 2 * below_b + 2, (below_a, below_b)
    assert result.answers["value_guided"][0][0] == "5"


def test_beam_search_extends_by_steps_and_stays_within_budget(scripted_server):
    scripted_server.routes["/v1/completions"] = lambda n: (
        200, scripted_server.completion_body(f"line {n}", token_logprobs=(-0.1 * n,)), 0.0)
    client = LLMClient(scripted_server.url("/v1"), model="m")
    result = run_search(client, [Question("q", "1")], budgets=[9], methods=["beam"])
    bodies = scripted_server.bodies
    steps = [b for b in bodies if "\n" in b["stop"]]
    rollouts = [b for b in bodies if "\n" not in b["stop"]]
    assert len(bodies) == result.calls["beam"][0, 0] <= 9
    # 1 beam x 2 steps, then 2 beams x 2 steps, then the 3 calls left as rollouts
    assert len(steps) == 6 and len(rollouts) == 3
    # the kept beams have the best mean step log-probability (lower n scores higher)
    assert {b["prompt"].split("assistant\n")[1] for b in rollouts} == {
        "line 0\nline 2\n", "line 0\nline 3\n"}
