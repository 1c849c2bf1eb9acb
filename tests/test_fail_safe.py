"""Readers and runs that fail safe (issue 16 item 9): a corrupt or truncated .gz, and a budget
too large to run, get one line naming the problem and exit code 2, before any allocation."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

import pytest

from canopy.apps.routing.datasets import _matrix
from canopy.instances import piecewise_lipschitz
from canopy.policies import TopKBeam
from canopy.run import MAX_QUERIES, run


def _pool(tmp_path):
    rows = "\n".join(f"m{i},{(i % 9 + 1) / 10},{(i % 7 + 1) / 10}" for i in range(40))
    return f"model,value,other\n{rows}\n".encode()


def _canopy(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "canopy", *args], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_gzip_pool_is_one_line(tmp_path, damage):
    file = tmp_path / "pool.csv.gz"
    whole = gzip.compress(_pool(tmp_path))
    file.write_bytes(b"not gzip at all" if damage == "garbage" else whole[: len(whole) // 2])
    done = _canopy("topk", "--pool", str(file), "--target", "value", "--budget", "100")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "gzip" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_damaged_gzip_matrix_names_its_file(tmp_path):
    file = tmp_path / "matrix.csv.gz"
    file.write_bytes(gzip.compress(b"q,a,b\nx,1,0\n" * 50)[:16])
    with pytest.raises(ValueError, match=r"matrix\.csv\.gz"):
        _matrix(file)


def test_a_budget_too_large_to_run_is_refused_before_allocating(tmp_path):
    problem = piecewise_lipschitz(4, 3, 1, seed=0).problem
    with pytest.raises(ValueError, match="at most 1e\\+09"):
        run(TopKBeam(k=3), problem, budget=10.0 * MAX_QUERIES * problem.spec.leaf_cost)
    file = tmp_path / "pool.csv"
    file.write_bytes(_pool(tmp_path))
    done = _canopy("topk", "--pool", str(file), "--target", "value", "--budget", "1e12")
    assert done.returncode == 2 and "budget 1e+12" in done.stderr
    assert done.stderr.strip().count("\n") == 0


@pytest.mark.parametrize(("line", "message"), [
    ('{"timestamp": 1, "input_length": Infinity, "hash_ids": [1]}', "input_length must be"),
    ('{"timestamp": NaN, "input_length": 10, "hash_ids": [1]}', "timestamp must be"),
    ('{"timestamp": 5, "input_length": 10, "hash_ids": [1]}\n'
     '{"timestamp": 1, "input_length": 10, "hash_ids": [2]}', ":2: timestamp 1 is before"),
])
def test_a_bad_cache_trace_is_one_line_naming_its_line(tmp_path, line, message):
    file = tmp_path / "trace.jsonl"
    file.write_text(line + "\n")
    done = _canopy("cache", "replay", "--trace", str(file), "--capacity", "4")
    assert done.returncode == 2 and message in done.stderr
    assert done.stderr.strip().count("\n") == 0


def test_a_zero_window_is_refused_before_the_sweep():
    done = _canopy("cache", "replay", "--trace", "conversation", "--capacity", "4",
                   "--window", "0")
    assert done.returncode == 2 and "--window must be >= 1" in done.stderr


def test_the_one_jsonl_reader_names_the_line(tmp_path):
    from canopy.data import jsonl_rows

    path = tmp_path / "rows.jsonl"
    path.write_text('\ufeff{"a": 1}\n\n{"b": 2}\n[3]\n{oops\n', encoding="utf-8")
    rows = jsonl_rows(path)
    assert next(rows) == (1, {"a": 1}) and next(rows) == (3, {"b": 2})  # BOM, blank skipped
    with pytest.raises(ValueError, match=r"rows\.jsonl:4: expected a JSON object"):
        next(rows)
    with pytest.raises(ValueError, match=r"rows\.jsonl:5: not valid JSON"):
        list(jsonl_rows(path, objects=False))
