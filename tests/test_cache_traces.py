"""Trace readers: Mooncake JSONL (incl. the tool-agent format), prompt logs, bad lines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from canopy import data
from canopy.prefix import load_mooncake, load_prompt_log, resolve
from canopy.prefix.traces import shifted

TOOLAGENT_ROWS = [
    {"timestamp": 0, "input_length": 1500, "output_length": 12, "hash_ids": [0, 1, 2]},
    {"timestamp": 40, "input_length": 2100, "output_length": 7, "hash_ids": [0, 1, 3, 4, 5]},
    {"timestamp": 95, "input_length": 600, "output_length": 3, "hash_ids": [0, 6]},
]


def _write(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_toolagent_format_loads_by_path_and_by_name(tmp_path, monkeypatch):
    (tmp_path / "mooncake").mkdir()
    file = _write(tmp_path / "mooncake" / "toolagent_trace.jsonl", TOOLAGENT_ROWS)
    trace = load_mooncake(file)
    assert trace.n_requests == 3 and trace.n_refs == 10 and trace.n_nodes == 7
    assert trace.path(1)[:2].tolist() == trace.path(0)[:2].tolist()  # shared prefix 0, 1
    assert trace.block_size == 512 and trace.input_tokens.tolist() == [1500, 2100, 600]
    monkeypatch.setenv("CANOPY_DATA_DIR", str(tmp_path))
    assert resolve("toolagent").n_refs == 10
    assert resolve(str(file)).n_nodes == 7


def test_missing_toolagent_says_how_to_supply_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CANOPY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CANOPY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CANOPY_DOWNLOAD", raising=False)
    with pytest.raises(data.DataNotFound, match=r"toolagent_trace\.jsonl"):
        resolve("toolagent")


def test_hash_reused_under_another_parent_is_another_block(tmp_path):
    rows = [{"timestamp": 0, "input_length": 10, "hash_ids": [1, 2]},
            {"timestamp": 1, "input_length": 10, "hash_ids": [3, 2]}]
    trace = load_mooncake(_write(tmp_path / "t.jsonl", rows))
    assert trace.n_nodes == 4


@pytest.mark.parametrize(("line", "why"), [
    ("{not json", "not valid JSON"),
    ('{"timestamp": 1, "input_length": 5}', "missing field"),
    ('{"timestamp": 1, "input_length": 5, "hash_ids": [1, null]}', "list of integers"),
    ('{"timestamp": -1, "input_length": 5, "hash_ids": [1]}', "timestamp"),
    ("[1, 2]", "JSON object"),
])
def test_malformed_mooncake_line_is_named(tmp_path, line, why):
    file = _write(tmp_path / "bad.jsonl", [TOOLAGENT_ROWS[0], line])
    with pytest.raises(ValueError, match=rf"bad.jsonl:2: .*{why}"):
        load_mooncake(file)


def test_prompt_log_chains_full_blocks(tmp_path):
    rows = ["[1, 2, 3, 4, 5]", json.dumps({"tokens": [1, 2, 3, 4, 9, 9], "timestamp": 7}),
            json.dumps({"token_ids": [5, 6, 1, 2]})]
    trace = load_prompt_log(_write(tmp_path / "log.jsonl", rows), block_size=2)
    assert [len(trace.path(i)) for i in range(3)] == [2, 3, 2]  # partial blocks dropped
    assert trace.path(1)[:2].tolist() == trace.path(0).tolist()
    assert trace.path(2)[0] != trace.path(0)[0]  # (5,6) differs from (1,2)
    assert trace.timestamps[1] == 7 and trace.input_tokens.tolist() == [5, 6, 4]
    assert resolve(str(tmp_path / "log.jsonl"), block_size=2).n_nodes == trace.n_nodes


def test_prompt_log_bad_line_and_block_size(tmp_path):
    file = _write(tmp_path / "log.jsonl", ["[1, 2]", '{"text": "hi"}'])
    with pytest.raises(ValueError, match=r"log.jsonl:2: .*tokens"):
        load_prompt_log(file)
    with pytest.raises(ValueError, match="block_size"):
        load_prompt_log(file, block_size=0)
    with pytest.raises(ValueError, match="existing file"):
        resolve(str(tmp_path / "nope.jsonl"))


def test_shift_uses_disjoint_block_space(tmp_path):
    trace = load_mooncake(_write(tmp_path / "t.jsonl", TOOLAGENT_ROWS))
    joined, start = shifted(trace, trace)
    assert start == 3 and joined.n_requests == 6
    assert not set(joined.nodes[:10].tolist()) & set(joined.nodes[10:].tolist())
    assert np.array_equal(joined.parent[7:] - 7, np.where(trace.parent < 0, -8, trace.parent))


def test_mirrored_traces_load(data_file):
    conv = load_mooncake(data_file("mooncake", "conversation_trace.jsonl"))
    assert conv.n_requests == 12031 and conv.n_refs == 288500
    synth = load_mooncake(data_file("mooncake", "synthetic_trace.jsonl"))
    assert synth.n_requests == 3993
