"""Pools from score tables: user CSVs (scale detection, errors) and the three public tables."""

from __future__ import annotations

import gzip
import re

import numpy as np
import pytest

from canopy.apps.topk import (
    Pool,
    alpaca_eval,
    can_ai_code,
    load_pool,
    open_llm_leaderboard,
    read_pool_csv,
)


def write(tmp_path, text, name="pool.csv"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


CSV = """model,org,mmlu,arc,notes
a,x,71.5,60,fine
b,x,40.0,55.5,fine
c,y,12.5,30,fine
a,y,90.0,80,again
"""


def test_percent_detected_and_features_default_to_other_numeric_columns(tmp_path):
    pool = read_pool_csv(write(tmp_path, CSV), target="mmlu")
    assert pool.names == ("a", "b", "c", "a #2")  # repeats kept, suffixed
    np.testing.assert_allclose(pool.target, [0.715, 0.40, 0.125, 0.90])
    assert pool.feature_names == ("arc",)  # name, org and notes are not numbers
    np.testing.assert_allclose(pool.features[:, 0], [0.60, 0.555, 0.30, 0.80])
    assert pool.top_rows(2).tolist() == [3, 0]


def test_fractions_kept_and_gzip_read(tmp_path):
    path = tmp_path / "pool.csv.gz"
    path.write_bytes(gzip.compress(b"name,score,other\nm1,0.25,0.5\nm2,1.0,0.0\n"))
    pool = read_pool_csv(path, target="score", group_columns=())
    np.testing.assert_allclose(pool.target, [0.25, 1.0])
    forced = read_pool_csv(path, target="score", scale="percent")
    np.testing.assert_allclose(forced.target, [0.0025, 0.01])


@pytest.mark.parametrize(("text", "kwargs", "message"), [
    ("model,mmlu\na,50\nb,60,7\n", {"target": "mmlu"}, "row 3: 3 fields"),
    ("model,mmlu\na,50\n", {"target": "MMLU"}, "no target column 'MMLU'"),
    ("model,mmlu\na,50\nb,n/a\n", {"target": "mmlu"}, "row 3: column 'mmlu' holds 'n/a'"),
    ("model,mmlu\na,50\nb,\n", {"target": "mmlu"}, "row 3: column 'mmlu' holds ''"),
    ("model,mmlu\na,50\nb,120\n", {"target": "mmlu"}, "row 3: column 'mmlu' holds '120'"),
    ("model,mmlu\na,-0.5\nb,0.5\n", {"target": "mmlu"}, "outside [0, 1]"),
    ("", {"target": "mmlu"}, "empty file"),
    ("model,mmlu\n", {"target": "mmlu"}, "no candidates"),
    ("model,mmlu,mmlu\na,1,2\n", {"target": "mmlu"}, "repeated column"),
    ("model,mmlu,arc\na,1,2\n", {"target": "mmlu", "feature_columns": ["hs"]},
     "no feature column 'hs'"),
    ("model,mmlu\na,1\n", {"target": "mmlu", "feature_columns": ["mmlu"]},
     "cannot also be a feature"),
    ("model,mmlu\na,1\n", {"target": "mmlu", "group_columns": ["family"]},
     "no group column 'family'"),
])
def test_malformed_csv_gets_a_clear_error(tmp_path, text, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        read_pool_csv(write(tmp_path, text), **kwargs)


def test_unreadable_and_non_utf8_files(tmp_path):
    with pytest.raises(ValueError, match=r"missing\.csv: cannot open pool file: No such file"):
        read_pool_csv(tmp_path / "missing.csv", target="x")
    path = tmp_path / "latin.csv"
    path.write_bytes("model,x\nm\xe9,0.5\n".encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8"):
        read_pool_csv(path, target="x")


def test_k_larger_than_the_pool_is_refused(tmp_path):
    pool = read_pool_csv(write(tmp_path, CSV), target="mmlu")
    with pytest.raises(ValueError, match=r"k must be in 1\.\.4"):
        pool.top_rows(5)
    with pytest.raises(TypeError):
        pool.top_rows(2.0)


def test_pool_validates_its_parts():
    with pytest.raises(ValueError, match="must lie in"):
        Pool("p", ("a", "b"), np.array([0.5, 1.5]), "t", np.empty((2, 0)), ())
    with pytest.raises(ValueError, match="row means of items"):
        Pool("p", ("a", "b"), np.array([0.5, 0.5]), "t", np.empty((2, 0)), (),
             items=np.array([[1.0, 0.0], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="no item outcomes"):
        Pool("p", ("a", "b"), np.array([0.5, 0.5]), "t", np.empty((2, 0)), (),
             items=np.array([[1.0, 0.0], [np.nan, np.nan]]))
    with pytest.raises(ValueError, match="repeated names"):
        Pool("p", ("a", "a"), np.array([0.5, 0.5]), "t", np.empty((2, 0)), ())


def test_open_llm_leaderboard_pool(data_file):
    data_file("open_llm_leaderboard_v1", "20230904.csv")
    pool = open_llm_leaderboard("MMLU")
    assert pool.size == 1291 and len(set(pool.names)) == 1291
    assert pool.feature_names == ("ARC", "HellaSwag", "TruthfulQA")
    assert 0.2 < pool.target.min() and pool.target.max() < 0.8  # percent -> [0, 1]
    assert pool.items is None
    with pytest.raises(ValueError, match="target must be one of"):
        open_llm_leaderboard("Average")


def test_can_ai_code_pool(data_file):
    data_file("can-ai-code", "results_long.csv.gz")
    pool = can_ai_code()
    assert pool.size == 700 and pool.items is not None and pool.items.shape == (700, 28)
    assert set(pool.groups) == {"family", "model"} and len(set(pool.groups["family"])) == 50
    np.testing.assert_allclose(pool.target, np.nanmean(pool.items, axis=1))


def test_alpaca_eval_pool(data_file):
    data_file("alpaca_eval", "weighted_alpaca_eval_gpt4_turbo_preference_matrix.csv")
    data_file("alpaca_eval", "annotations_long.csv.gz")
    pool = alpaca_eval()
    assert pool.size == 62 and pool.items is not None and pool.items.shape == (62, 403)
    assert len(pool.feature_names) == 5
    reference = pool.names.index("gpt4_1106_preview")  # judged against itself: 0.5
    assert pool.target[reference] == pytest.approx(0.5, abs=1e-6)


def test_load_pool_names(data_file):
    data_file("open_llm_leaderboard_v1", "20230904.csv")
    pool = load_pool("open-llm-leaderboard:ARC")
    assert pool.target_name == "ARC" and "MMLU" in pool.feature_names
    for bad in ("routereval", "can-ai-code:ARC"):
        with pytest.raises(ValueError, match="unknown pool"):
            load_pool(bad)


def test_one_percent_looking_value_in_a_fraction_column_is_refused_naming_its_row(tmp_path):
    rows = "".join(f"m{i},{0.1 * (i % 9) + 0.05:.2f}\n" for i in range(10))
    path = write(tmp_path, "model,score\n" + rows + "m10,1.5\n")
    with pytest.raises(ValueError, match="rows 12 hold values above 1"):
        read_pool_csv(path, target="score", group_columns=())
    forced = read_pool_csv(path, target="score", group_columns=(), scale="percent")
    assert forced.target[-1] == 0.015 and len(forced.names) == 11
