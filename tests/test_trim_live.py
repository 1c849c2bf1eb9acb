"""Live trimming on a handful of BBH items against the SmolLM2-135M llama-cpp server: the
server-reported input tokens follow the trim levels, requested budgets are met up to the
estimate's error, a rerun is served from the cache, and a failing server stops collection
with the finished items kept."""

from __future__ import annotations

import numpy as np
import pytest

from canopy.apps.trim.run import collect, summarise
from canopy.apps.trim.trimmers import default_levels
from canopy.llm import LLMClient
from canopy.tasks.bbh import Item, load_task, parse_cot_prompt


@pytest.mark.live
def test_live_trimming_tokens_follow_levels_and_rerun_is_cached(llm_server, data_file,
                                                                tmp_path):
    folder = data_file("bbh", "bbh/sports_understanding.json").parent.parent
    tasks = {"sports_understanding": load_task(folder, "sports_understanding", n=2)}
    keep = ("full", "shots1", "shots0", "keep_first120", "bm25_120")
    levels = [lv for lv in default_levels(budget_tokens=120) if lv.name in keep]
    kwargs = {"model": llm_server.model, "api_key_env": None, "cache_dir": tmp_path}
    with LLMClient(llm_server.base_url, **kwargs) as client:
        run = collect(client, tasks, levels, max_tokens=4)
        # identical prompts (two levels that trim to the same text) are asked once
        assert client.usage.calls + client.usage.cache_hits == 2 * len(levels)
    assert run.error is None and run.completed == 2
    achieved = dict(zip(keep, run.tokens.mean(axis=0), strict=True))
    # the server's own token counts order the structural trims as intended
    assert achieved["full"] > achieved["shots1"] > achieved["shots0"]
    for i, level in enumerate(levels):
        if level.requested_tokens is not None:
            # our chars/4 estimate stays within 35% of the tokenizer's count
            assert np.all(run.tokens[:, i] <= 1.35 * level.requested_tokens), level.name
    assert np.all(np.abs(run.estimated / run.tokens - 1) < 0.5)
    rows = summarise(run, n_orders=3, n_resamples=200)
    assert rows[0]["method"].startswith("adaptive") and rows[-1]["method"] == "per-item oracle"
    assert rows[-1]["accuracy"] >= max(r["accuracy"] for r in rows[1:-1])

    before = llm_server.request_count
    with LLMClient(llm_server.base_url, **kwargs) as client:
        again = collect(client, tasks, levels, max_tokens=4)
        assert client.usage.calls == 0
    assert llm_server.request_count == before
    np.testing.assert_array_equal(run.correct, again.correct)


def test_failing_server_keeps_finished_items(scripted_server):
    scripted_server.routes["/v1/completions"] = lambda n: (
        (200, scripted_server.completion_body(" So the answer is Yes."), 0.0) if n < 14
        else (503, b"overloaded", 0.0))
    prompt_text = ("-----\nSay yes.\n\nQ: Is it?\nA: Let's think step by step.\nIt is. "
                   "So the answer is Yes.")
    prompt = parse_cot_prompt(prompt_text)
    items = [Item("t", f"Is {i}?", "Yes") for i in range(3)]
    more = [Item("u", f"Is {i}?", "Yes") for i in range(3)]
    levels = default_levels(budget_tokens=100)[:4]
    client = LLMClient(scripted_server.url("/v1"), model="m", max_retries=0)
    run = collect(client, {"t": (prompt, items), "u": (prompt, more)}, levels)
    assert run.completed == 3 and "task u" in run.error and "503" in run.error
    assert np.all(run.correct[:3] == 1.0) and np.all(np.isnan(run.correct[3:]))
    rows = summarise(run, n_orders=2, n_resamples=100)
    assert all(row["items"] == 3 for row in rows)
