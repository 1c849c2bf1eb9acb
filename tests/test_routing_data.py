"""Routing data: the long log format, RouterBench's pickle, the mirrored data sets, the CLI,
and the claims of issue 5 on RouteLLM MMLU."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from canopy.apps.routing import datasets as ds
from canopy.apps.routing import load, read_long, read_routerbench, replay
from canopy.apps.routing.cli import register

ROWS = [
    ("q1", "stem/physics", "small", 0.2, 0.001, 10, 5),
    ("q1", "stem/physics", "large", 0.9, 0.010, 10, 7),
    ("q2", "humanities", "small", 1.0, 0.001, 12, 5),
    ("q2", "humanities", "large", 1.0, 0.012, 12, 9),
    ("q3", "humanities", "small", 0.5, 0.002, 8, 6),  # no 'large' row: dropped
]
HEADER = ("query_id", "region", "model", "quality", "cost", "input_tokens", "output_tokens")


def write_csv(path, rows, header=HEADER):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_long_format_csv_and_jsonl_agree(tmp_path):
    from_csv = read_long(write_csv(tmp_path / "log.csv", ROWS))
    jsonl = tmp_path / "log.jsonl"
    jsonl.write_text("\n".join(json.dumps(dict(zip(HEADER, r, strict=True))) for r in ROWS))
    from_jsonl = read_long(jsonl)
    for outcomes in (from_csv, from_jsonl):
        assert outcomes.query_ids == ("q1", "q2") and outcomes.models == ("small", "large")
        assert outcomes.regions == ("stem/physics", "humanities")
        assert outcomes.quality.tolist() == [[0.2, 0.9], [1.0, 1.0]]
        assert outcomes.output_tokens.tolist() == [[5, 7], [5, 9]]
        assert "dropped 1 queries" in outcomes.notes[0]
    assert load(str(tmp_path / "log.csv")).models == ("small", "large")


@pytest.mark.parametrize("row, message", [
    (("q9", "x", "small", 1.5, 0.1, 1, 1), r"log.csv:3: quality 1.5 is outside"),
    (("q9", "x", "small", 0.5, -0.1, 1, 1), r"log.csv:3: cost -0.1 is outside"),
    (("q9", "x", "small", "good", 0.1, 1, 1), r"log.csv:3: quality 'good' is not a number"),
    (("", "x", "small", 0.5, 0.1, 1, 1), r"log.csv:3: empty or missing query_id"),
    (("q9", "x", "small", 0.5, 0.1, 1, ""), r"log.csv:3: give both"),
    (("q1", "other", "small", 0.5, 0.1, 1, 1), r"log.csv:3: query 'q1' was in region"),
    (("q1", "stem/physics", "small", 0.5, 0.1, 1, 1), r"log.csv:3: second row"),
])
def test_long_format_bad_rows_name_the_line(tmp_path, row, message):
    with pytest.raises(ValueError, match=message):
        read_long(write_csv(tmp_path / "log.csv", [ROWS[0], row]))


def test_long_format_bad_files(tmp_path):
    with pytest.raises(ValueError, match="header lacks columns"):
        read_long(write_csv(tmp_path / "log.csv", [("q", "r", "m")], ("query_id", "x", "y")))
    bad = tmp_path / "log.jsonl"
    bad.write_text('{"query_id": "q"}\nnot json\n')
    with pytest.raises(ValueError, match=r"log.jsonl:1: empty or missing model"):
        read_long(bad)
    with pytest.raises(ValueError, match=r"expected a \.csv or \.jsonl"):
        read_long(tmp_path / "log.txt")
    with pytest.raises(KeyError, match="unknown data set"):
        load("no-such-set")


def test_routerbench_pickle_format(tmp_path):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({
        "sample_id": ["mmlu-anatomy.val.5.0", "mmlu-anatomy.val.5.1", "hellaswag.dev.v0.0"],
        "prompt": ["a", "b", "c"],
        "eval_name": ["mmlu-anatomy.val.5", "mmlu-anatomy.val.5", "hellaswag.dev.v0"],
        "gpt-4-1106-preview": [1.0, 0.0, 1.0],
        "gpt-4-1106-preview|model_response": ["A", "B", "C"],
        "gpt-4-1106-preview|total_cost": [0.002, 0.003, 0.004],
        "mistralai/mistral-7b-chat": [0.0, 0.0, np.nan],
        "mistralai/mistral-7b-chat|model_response": ["D", "E", "F"],
        "mistralai/mistral-7b-chat|total_cost": [0.0001, 0.0001, 0.0001],
        "oracle_model_to_route_to": ["gpt-4-1106-preview"] * 3,
    })
    path = tmp_path / "routerbench_0shot.pkl"
    frame.to_pickle(path)
    with pytest.raises(ValueError, match="--trust-pickle"):
        load(str(path))  # unpickling can run code: refused unless trusted
    outcomes = load(str(path), trust_pickle=True)
    assert outcomes.models == ("gpt-4-1106-preview", "mistralai/mistral-7b-chat")
    assert outcomes.n_queries == 2  # the NaN score is dropped
    assert outcomes.regions == ("mmlu/mmlu-anatomy.val.5",) * 2
    assert outcomes.cost[:, 0].tolist() == [0.002, 0.003]
    assert "dropped 1" in outcomes.notes[0]
    with pytest.raises(KeyError, match="no score and total_cost columns"):
        read_routerbench(path, models=["claude"], trust_pickle=True)


class _Payload:
    def __reduce__(self):
        return (open, (_Payload.target, "w"))


def test_a_crafted_pickle_runs_no_code(tmp_path):
    import pickle
    _Payload.target = str(tmp_path / "pwned")
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(ValueError, match="refusing to unpickle"):
        load(str(path))
    assert not (tmp_path / "pwned").exists()


def test_a_csv_with_a_byte_order_mark_is_read(tmp_path):
    rows = [(f"q{i}", "r", m, 1.0, 0.001, 5, 5) for i in range(3) for m in ("a", "b")]
    log = write_csv(tmp_path / "log.csv", rows)
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + log.read_bytes())
    assert read_long(bom).n_queries == read_long(log).n_queries == 3


def test_cli_replay_json(tmp_path):
    app = typer.Typer()
    register(app)
    rows = [(f"q{i}", f"r{i % 3}", m, float((i + j) % 2), 0.001 * (j + 1), 5, 5)
            for i in range(60) for j, m in enumerate(("a", "b"))]
    log = write_csv(tmp_path / "log.csv", rows)
    figure = tmp_path / "frontier.png"
    result = CliRunner().invoke(app, ["route", "replay", "--dataset", str(log), "--lambdas",
                                      "0 100 1000", "--seeds", "2", "--json", "--plot",
                                      str(figure)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert "plot written to" in result.stderr
    assert set(summary["routers"]) >= {"regional", "flat", "category-oracle", "fixed:a"}
    points = summary["routers"]["regional"]["points"]
    assert [p["lambda"] for p in points] == [0.0, 100.0, 1000.0]
    assert all({"quality", "cost"} <= set(p) for p in points)
    assert "aiq" in summary["routers"]["flat"]
    assert figure.stat().st_size > 10_000
    bad = CliRunner().invoke(app, ["route", "replay", "--dataset", str(log), "--lambdas", "x"])
    assert bad.exit_code != 0


def test_cli_replay_warm_start(tmp_path):
    """``--train-fraction``: the same JSON, scored on the held-out rest; a bad fraction is one
    line and exit code 2."""
    app = typer.Typer()
    register(app)
    rows = [(f"q{i}", f"r{i % 3}", m, float((i * (j + 1)) % 3 > 0), 0.001 * (j + 1), 5, 5)
            for i in range(90) for j, m in enumerate(("a", "b"))]
    log = write_csv(tmp_path / "log.csv", rows)
    args = ["route", "replay", "--dataset", str(log), "--lambdas", "0 100", "--seeds", "2",
            "--json"]
    cold = json.loads(CliRunner().invoke(app, args).stdout)
    warm = CliRunner().invoke(app, [*args, "--train-fraction", "0.5"])
    assert warm.exit_code == 0, warm.output
    summary = json.loads(warm.stdout)
    assert set(summary) == set(cold) and set(summary["routers"]) == set(cold["routers"])
    assert summary["routers"]["regional"]["aiq"] != cold["routers"]["regional"]["aiq"]
    bad = CliRunner().invoke(app, [*args, "--train-fraction", "1.5"])
    assert bad.exit_code == 2 and "--train-fraction" in bad.output


@pytest.fixture
def mirror(data_file):
    data_file("routellm", "routellm/evals/mmlu/responses/mmlu_anatomy.csv")


def test_mirrored_data_sets_load(mirror, data_file):
    data_file("alpaca_eval", "annotations_long.csv.gz")
    data_file("arena_bench_v1", "single_score_matrix.csv")
    sizes = {name: (o.n_queries, o.n_models, len(set(o.regions)))
             for name, o in ((n, f()) for n, f in ds.DATASETS.items())}
    assert sizes["routellm-mmlu"] == (14042, 2, 57)
    assert sizes["routellm-gsm8k"] == (1319, 2, 3)
    assert sizes["mt-bench"] == (160, 2, 16)
    assert sizes["alpaca-eval"][0] == 805 and sizes["alpaca-eval"][2] == 5
    assert sizes["arena-bench"][1] == 15 and sizes["arena-bench"][2] == 1
    with pytest.raises(KeyError, match="no price for model"):
        ds.alpaca_eval(models=["gpt4_turbo", "Ein-70B-v0.1"])


def test_mmlu_regional_router_claims(mirror):
    """Issue 5: regional AIQ >= flat and >= the fixed models' hull; at some lambda >= 95% of
    the per-category oracle's quality at no more than its cost."""
    result = replay(ds.routellm_mmlu(), seeds=5,
                    routers=["regional", "flat", "category-oracle",
                             *(f"fixed:{m}" for m in ds.ROUTELLM_MODELS)])
    regional, regional_ci = result.aiq("regional")
    flat, flat_ci = result.aiq("flat")
    hull, _ = result.aiq("fixed-hull")
    assert regional - regional_ci > flat + flat_ci
    assert regional > hull
    assert result.near_oracle("regional", 0.95)


def test_cli_reads_a_pickle_only_when_trusted(tmp_path):
    import pickle
    app = typer.Typer()
    register(app)
    _Payload.target = str(tmp_path / "pwned")
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(_Payload()))
    refused = CliRunner().invoke(app, ["route", "replay", "--dataset", str(path)])
    assert refused.exit_code != 0
    assert "--trust-pickle" in str(refused.exception)
    assert not (tmp_path / "pwned").exists()
    trusted = CliRunner().invoke(app, ["route", "replay", "--dataset", str(path),
                                       "--trust-pickle"])
    assert (tmp_path / "pwned").exists()  # the flag is what lets the file's code run
    assert trusted.exit_code != 0  # ... and the payload is still no RouterBench frame


def test_the_proxy_starts_warm_from_a_log(tmp_path, upstreams):
    """``serve router --prior LOG``: the router is fitted on the log (code -> small, chat ->
    large), routes by it from the first request, and a restart on the same store does not
    count the log twice."""
    pytest.importorskip("fastapi")
    from canopy.apps.routing.proxy.app import create_app, read_prior, serve_in_thread
    from canopy.apps.routing.proxy.config import ProxyConfig

    rng = np.random.default_rng(0)
    rows = []
    for i in range(200):
        region = ("code", "chat")[i % 2]
        good = {"code": (0.9, 0.6), "chat": (0.1, 0.9)}[region]
        rows += [(f"q{i}", region, m, float(rng.random() < p), cost, 10, 5)
                 for m, p, cost in zip(("small", "large"), good, (1e-5, 1e-4), strict=True)]
    log = write_csv(tmp_path / "prior.csv", rows)
    cfg = ProxyConfig.from_mapping(
        {"upstreams": [{"model": m, "base_url": s.url("/v1")}
                       for m, s in zip(("small", "large"), upstreams, strict=True)],
         "state_path": "router.sqlite", "lam": 10.0,
         "prices": {"version": "t", "models": {"small": {"input": 1, "output": 1},
                                               "large": {"input": 10, "output": 10}}}},
        base=tmp_path)
    for _ in range(2):  # the second start finds the statistics in the store
        app = create_app(cfg, insecure_no_auth=True, prior=read_prior(log))
        with serve_in_thread(app) as url, httpx_client(url) as client:
            picks = {region: client.post("/v1/chat/completions", headers={
                "X-Canopy-Region": region}, json={"messages": [
                    {"role": "user", "content": "hi"}]}).json()["canopy"]["model"]
                for region in ("code", "chat")}
            stats = client.get("/v1/router/stats").json()["statistics"]
        assert picks == {"code": "small", "chat": "large"}
        root = {r["model"]: r["count"] for r in stats if r["region"] == "/"}
        assert root == {"small": 200, "large": 200}
    with pytest.raises(KeyError, match="no outcomes for models"):
        create_app(cfg.__class__(cfg.upstreams[:1], "memory",
                                 prices=cfg.prices), insecure_no_auth=True,
                   prior=read_prior(write_csv(tmp_path / "bad.csv", [
                       ("q", "r", "large", 1.0, 0.1, 1, 1)])))


def httpx_client(url):
    import httpx

    return httpx.Client(base_url=url, timeout=30)
