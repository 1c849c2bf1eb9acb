"""``canopy fleet bench``'s parts against scripted loopback workers: the interleaved stream,
the JSON, the Mooncake output and the simulator's prediction, the peer routers in front of
the workers, and the command line's bad input."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from canopy.apps.fleet import bench

BLOCK = 4


class Worker:
    """An OpenAI-compatible completions worker on loopback: a prompt of space-separated words
    is cached in blocks of ``BLOCK`` words (an unbounded prefix cache); every streamed answer
    carries the cached tokens in its usage; ``fail`` makes it answer 500; ``s_per_token``
    delays the first token by that much a prompt token (an engine's prefill)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.s_per_token = 0.0
        self.cached: set[tuple[str, ...]] = set()
        self.prompts: list[str] = []
        self.hits = self.queries = 0
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.release.set()
        worker = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _json(self, code: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # /health, /v1/models and the peers' probes
                self._json(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if isinstance(body.get("prompt"), list):  # token ids: one word a token
                    body["prompt"] = " ".join(f"t{t}" for t in body["prompt"])
                if not self.path.endswith("/v1/completions"):
                    self._json(404, {"error": "not found"})
                    return
                if worker.fail:
                    self._json(500, {"error": "scripted failure"})
                    return
                with worker.lock:
                    worker.in_flight += 1
                    worker.most_in_flight = max(worker.most_in_flight, worker.in_flight)
                worker.release.wait(10)
                cached = worker.serve(body["prompt"])
                time.sleep(worker.s_per_token * len(body["prompt"].split()))
                chunks = [{"choices": [{"index": 0, "text": "x"}]},
                          {"choices": [], "usage": {"prompt_tokens": len(
                              body["prompt"].split()), "prompt_tokens_details": {
                              "cached_tokens": cached}}}]
                data = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks)
                data += b"data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                with worker.lock:
                    worker.in_flight -= 1

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def serve(self, prompt: str) -> int:
        words = prompt.split()
        with self.lock:
            self.prompts.append(prompt)
            hit = 0
            blocks = [tuple(words[:i + BLOCK]) for i in range(0, len(words) // BLOCK * BLOCK,
                                                              BLOCK)]
            for block in blocks:
                if block not in self.cached:
                    break
                hit += 1
            self.cached.update(blocks)
            self.hits += hit * BLOCK
            self.queries += len(words)
        return hit * BLOCK

    @property
    def replica(self) -> bench.Replica:
        return bench.Replica(f"http://127.0.0.1:{self.server.server_port}", {}, "m",
                             lambda: (float(self.hits), float(self.queries)))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    made = [Worker() for _ in range(4)]
    yield made
    for worker in made:
        worker.close()


PROMPTS = [" ".join(f"p{k % 3}w{j}" for j in range(8)) + f" q{k}" for k in range(12)]


def test_interleave_sends_every_prompt_through_every_front_within_concurrency(workers):
    a = bench.Front("a", (workers[0].replica, workers[1].replica))  # client round-robin
    b = bench.Front("b", (workers[2].replica,), url=workers[2].replica.url)
    out = bench.interleave([a, b], PROMPTS, model="m", concurrency=2, max_tokens=1,
                           headers={})
    assert set(out) == {"a", "b"}
    for name in ("a", "b"):
        assert [o.error for o in out[name]] == [None] * len(PROMPTS)
        assert all(o.ttft_s <= o.total_s for o in out[name])
    assert sorted(workers[0].prompts + workers[1].prompts) == sorted(PROMPTS)
    assert workers[0].prompts == PROMPTS[0::2]  # rotation by request index
    assert sorted(workers[2].prompts) == sorted(PROMPTS)
    assert max(w.most_in_flight for w in workers[:3]) <= 2
    # the same prompt repeats its 8-word prefix: the worker reports 8 cached tokens
    assert [o.cached_tokens for o in out["b"]][3:] == [8] * (len(PROMPTS) - 3)


def test_interleave_holds_a_front_to_its_concurrency(workers):
    workers[0].release.clear()
    front = bench.Front("a", (workers[0].replica,), url=workers[0].replica.url)
    done = threading.Event()

    def run() -> None:
        bench.interleave([front], PROMPTS[:6], model="m", concurrency=3, max_tokens=1,
                         headers={})
        done.set()

    thread = threading.Thread(target=run)
    thread.start()
    assert not done.wait(0.5)
    assert workers[0].in_flight == 3
    workers[0].release.set()
    thread.join(10)
    assert done.is_set() and workers[0].most_in_flight == 3


def test_least_load_front_sends_around_a_busy_replica(workers):
    workers[0].release.clear()
    front = bench.Front("least-load", (workers[0].replica, workers[1].replica))
    thread = threading.Thread(target=bench.interleave, args=([front], PROMPTS[:6]),
                              kwargs={"model": "m", "concurrency": 2, "max_tokens": 1,
                                      "headers": {}})
    thread.start()
    try:
        for _ in range(100):  # the first request holds worker 0; the rest go to worker 1
            if len(workers[1].prompts) == 5:
                break
            threading.Event().wait(0.05)
        assert workers[0].in_flight == 1 and workers[1].prompts == PROMPTS[1:6]
    finally:
        workers[0].release.set()
        thread.join(10)


def test_ranking_compares_the_live_and_simulated_orders():
    def row(p90):
        return {"ttft_p90_s": {"mean": p90, "lo": p90, "hi": p90}}

    live = {"canopy": row(0.2), "sglang-router": row(0.3), "round-robin": row(0.5)}
    same = bench.ranking(live, {"canopy": row(1.0), "sglang-router": row(2.0),
                                "round-robin": row(3.0), "least_load": row(0.1)})
    assert same == {"live": ["canopy", "sglang-router", "round-robin"],
                    "simulator": ["canopy", "sglang-router", "round-robin"], "same": True}
    differ = bench.ranking(live, {"canopy": row(2.0), "sglang-router": row(1.0),
                                  "round-robin": row(3.0)})
    assert not differ["same"] and differ["simulator"][0] == "sglang-router"


def test_ranking_orders_one_router_a_simulated_rule():
    def row(p90, policy):
        return {"ttft_p90_s": {"mean": p90, "lo": p90, "hi": p90}, "policy": policy}

    live = {"canopy": row(0.2, None), "sglang-router": row(0.4, None),
            "vllm-router": row(0.3, None), "least-load": row(0.5, None)}
    simulated = {"canopy": row(1.0, "canopy"), "sglang-router": row(2.0, "sglang"),
                 "vllm-router": row(2.0, "sglang"), "least-load": row(3.0, "least_load")}
    assert bench.ranking(live, simulated) == {
        "live": ["canopy", "sglang-router", "least-load"],
        "simulator": ["canopy", "sglang-router", "least-load"], "same": True}


def test_bench_json_has_the_schema_and_counts_lost_requests(workers):
    failing = Worker(fail=True)
    try:
        good = bench.Front("sglang-router", (workers[0].replica,), url=workers[0].replica.url)
        bad = bench.Front("vllm-router", (failing.replica,), url=failing.replica.url)
        runs = {"sglang-router": bench.RouterRuns(), "vllm-router": bench.RouterRuns()}
        tokens = []
        for repeat in range(3):
            prompts = [p + f" r{repeat}" for p in PROMPTS]
            tokens.append([p.split() for p in prompts])
            out = bench.interleave([good, bad], prompts, model="m", concurrency=2,
                                   max_tokens=1, headers={})
            for name, outcomes in out.items():
                runs[name].outcomes.append(outcomes)
                runs[name].hit_rate.append(0.5)
            runs["sglang-router"].predicted.append({"exact": 9.0, "over": 1.0 + repeat})
        results = bench.bench_json(runs, tokens)
    finally:
        failing.close()
    ok = results["sglang-router"]
    for key in ("ttft_p50_s", "ttft_p90_s"):
        assert set(ok[key]) == {"mean", "lo", "hi"}
        assert ok[key]["lo"] <= ok[key]["mean"] <= ok[key]["hi"]
    assert ok["lost"] == 0 and ok["hit_rate"] == 0.5
    assert 0.5 < ok["reported_hit_rate"] < 1.0  # 8 of 10 tokens cached after the first 3
    assert results["vllm-router"]["lost"] == 3 * len(PROMPTS)
    assert ok["cached_prediction"] == {"exact": 27 / 33, "requests": 33, "over": 6,
                                       "under": 0}
    assert "cached_prediction" not in results["vllm-router"]  # it predicts nothing
    json.dumps(results)


def test_mooncake_output_reads_back_with_shared_prefixes(tmp_path):
    from canopy.apps.fleet.sim import load_trace

    tokens = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 0, 9], [1, 2, 3, 4, 5]]
    file = bench.write_mooncake(tmp_path / "s.jsonl", tokens, [0.5, 0.75, 1.0],
                                block_tokens=4, output_tokens=2)
    rows = [json.loads(line) for line in file.read_text().splitlines()]
    assert [r["timestamp"] for r in rows] == [0.0, 250.0, 500.0]
    assert [r["input_length"] for r in rows] == [9 * 128, 9 * 128, 5 * 128]
    assert rows[0]["output_length"] == 256
    assert len(rows[0]["hash_ids"]) == 2 and len(rows[2]["hash_ids"]) == 1
    assert rows[1]["hash_ids"][0] == rows[0]["hash_ids"][0] == rows[2]["hash_ids"][0]
    assert rows[1]["hash_ids"][1] != rows[0]["hash_ids"][1]
    trace = load_trace(file)
    assert trace.trace.n_requests == 3 and trace.working_set == 3


def test_prediction_ranks_cache_aware_routing_above_round_robin_on_a_shared_prefix_stream(
        tmp_path):
    import random

    rng = random.Random(0)
    prefixes = [[rng.randrange(10**6) for _ in range(64)] for _ in range(8)]
    tokens = [prefixes[rng.randrange(8)] + [rng.randrange(10**6) for _ in range(8)]
              for _ in range(400)]
    file = bench.write_mooncake(tmp_path / "s.jsonl", tokens, [i * 0.05 for i in range(400)],
                                block_tokens=16, output_tokens=4)
    out = bench.predict(file, ["canopy", "sglang-router", "round-robin"], n_replicas=2,
                        capacity_blocks=20, load=0.5, ms_per_token=0.5, overhead_ms=20.0,
                        tpot_ms=1.0, block_tokens=16, precise=True, seeds=2)
    rows = out["results"]
    assert set(rows) == {"canopy", "sglang-router", "round-robin", "least_load"}
    assert rows["canopy"]["index"] == "precise" and rows["sglang-router"]["policy"] == "sglang"
    assert rows["canopy"]["hit_rate"] > rows["round-robin"]["hit_rate"] + 0.1
    assert rows["sglang-router"]["hit_rate"] > rows["least_load"]["hit_rate"] + 0.1


PEERS_FOUND = [p for p in bench.PEERS if shutil.which(p) or (
    Path(sys.executable).parent / p).is_file()]


@pytest.mark.parametrize("peer", bench.PEERS)
def test_peer_router_routes_to_loopback_workers_by_prefix(peer, workers):
    if peer not in PEERS_FOUND:
        pytest.skip(f"{peer} is not installed ({bench.INSTALL}; extra 'peers')")
    replicas = [workers[0].replica, workers[1].replica]
    with bench.peer_router(peer, replicas) as url:
        front = bench.Front(peer, tuple(replicas), url=url)
        prompts = [" ".join(f"s{k % 2}w{j}" for j in range(40)) + f" q{k}" for k in range(8)]
        out = bench.interleave([front], prompts, model="m", concurrency=1, max_tokens=1,
                               headers={"Authorization": "Bearer k"})
    assert [o.error for o in out[peer]] == [None] * 8
    assert len(workers[0].prompts) + len(workers[1].prompts) == 8
    # cache-aware: each shared prefix stays on the worker that first served it
    for k in range(2):
        homes = {w for w in (0, 1) for p in workers[w].prompts if p.startswith(f"s{k}w0 ")}
        assert len(homes) == 1
    assert sum(o.cached_tokens for o in out[peer]) == 6 * 40


def _fails_in_one_line(argv, capsys, words):
    from canopy.cli import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert done.value.code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert all(w in err[0] for w in words), err[0]


@pytest.mark.parametrize(("args", "words"), [
    (["--engine", "tgi"], ["--engine", "tgi"]),
    (["--peers", "nginx"], ["unknown", "nginx"]),
    (["--peers", "round-robin,round-robin"], ["repeated"]),
    (["--requests", "0"], ["--requests"]),
    (["--workload", "toolagent"], ["--workload"]),
])
def test_cli_bad_input_is_one_line_exit_2(args, words, capsys):
    _fails_in_one_line(["fleet", "bench", *args], capsys, words)


def test_cli_missing_peer_binary_says_how_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no router beside it
    monkeypatch.setenv("PATH", str(tmp_path))
    _fails_in_one_line(["fleet", "bench", "--no-canopy", "--peers", "sglang-router"], capsys,
                       ["sglang-router is not installed", "pip install sglang-router"])


def test_canopy_gateway_routes_to_loopback_workers(workers):
    pytest.importorskip("uvicorn")
    replicas = [workers[0].replica, workers[1].replica]
    with bench.canopy_gateway(replicas, precise=bench.publishes_events(replicas)) as url:
        front = bench.Front("canopy", tuple(replicas), url=url,
                            predictions=lambda: bench.gateway_predictions(url))
        before = front.predicted()
        prompts = [" ".join(f"s{k % 2}w{j}" for j in range(40)) + f" q{k}" for k in range(8)]
        out = bench.interleave([front], prompts, model="m", concurrency=1, max_tokens=1,
                               headers={})
        after = front.predicted()
    assert [o.error for o in out["canopy"]] == [None] * 8
    assert len(workers[0].prompts) + len(workers[1].prompts) == 8
    # every answer reported its cached tokens, so the gateway compared each with its index
    assert sum(after.values()) - sum(before.values()) == 8


def test_fit_recovers_a_line_and_refuses_too_few_points():
    pairs = [(float(x), 40.0 + 2.5 * x) for x in range(0, 400, 40)]
    per_token, overhead = bench._fit(pairs)
    assert per_token == pytest.approx(2.5) and overhead == pytest.approx(40.0)
    assert bench._fit(pairs[:7]) is None
    assert bench._fit([(5.0, float(y)) for y in range(10)]) is None  # no spread
    assert bench._fit([(float(x), 100.0 - x) for x in range(10)]) is None  # no time a token


def test_calibration_sends_each_prompt_once_one_at_a_time_over_every_replica(workers):
    replicas = [w.replica for w in workers[:2]]
    for worker in workers[:2]:
        worker.s_per_token = 0.002  # 16-136 ms a prompt: a slope no machine load hides
    prompts = [(" ".join(f"w{k}x{i}" for i in range(n)), n)
               for k, n in enumerate(range(8, 72, 4))]
    fitted = bench.calibrate(replicas, prompts, max_tokens=1)
    assert fitted is not None and fitted[0] > 0
    # one untimed request a replica first, then each prompt once, as text
    assert [w.prompts[0] for w in workers[:2]] == [" hello"] * 2
    assert workers[0].prompts[1:] + workers[1].prompts[1:] == \
        [p for p, _ in prompts[0::2]] + [p for p, _ in prompts[1::2]]
    assert max(w.most_in_flight for w in workers[:2]) == 1
    assert workers[0].hits == workers[1].hits == 0  # distinct prompts: nothing cached


def test_calibration_prompts_spread_their_lengths():
    class Vocab:
        def tokenize(self, text: bytes, *, add_bos: bool, special: bool) -> list[int]:
            return [1] * add_bos + [len(w) for w in text.split()]

    prompts = bench.calibration_prompts(["aa", "bbb", "cccc"], Vocab(), 5, low=10, high=50,
                                        bos=True, seed=0)
    assert [length for _, length in prompts] == [10, 20, 30, 40, 50]
    assert all(len(text.split()) == length - 1 for text, length in prompts)  # and the BOS


def test_the_gateway_plays_the_engines_calibrated_overhead(workers):
    from canopy.apps.routing.proxy.config import ProxyConfig
    from canopy.fleet import make_policy

    replicas = [workers[0].replica, workers[1].replica]
    data = bench.gateway_config(replicas, precise=False, overhead_tokens=900.0)
    upstream = ProxyConfig.from_mapping(data).upstreams[0]
    policy = make_policy(upstream.replica_policy, **upstream.replica_options)
    assert policy.params[1] == 900.0
    default = ProxyConfig.from_mapping(bench.gateway_config(replicas, precise=False))
    assert default.upstreams[0].replica_options == {}
    data["upstreams"][0]["replica_options"] = {"colour": 1}
    with pytest.raises(ValueError):
        ProxyConfig.from_mapping(data)


def test_prediction_on_batched_replicas_sharing_cores_ranks_the_hits_first(tmp_path):
    """vLLM's replicas (``SIM_ENGINE``: batched) on a saturated machine: the rule with the
    most hits ahead of least_load, the replay's engine and cores recorded."""
    import random

    assert bench.SIM_ENGINE == {"vllm": "batched", "llama": "serial"}
    rng = random.Random(0)
    prefixes = [[rng.randrange(10**6) for _ in range(64)] for _ in range(8)]
    tokens = [prefixes[min(int(rng.paretovariate(1.0)) - 1, 7)] +
              [rng.randrange(10**6) for _ in range(8)] for _ in range(400)]
    file = bench.write_mooncake(tmp_path / "s.jsonl", tokens, [i * 0.05 for i in range(400)],
                                block_tokens=16, output_tokens=4)
    out = bench.predict(file, ["sglang-router"], n_replicas=2, capacity_blocks=10, load=0.9,
                        ms_per_token=1.4, overhead_ms=300.0, tpot_ms=1.4, block_tokens=16,
                        precise=True, seeds=2, engine="batched", cores=1.0)
    rows = out["results"]
    assert (out["engine"], out["cores"]) == ("batched", 1.0)
    assert rows["sglang-router"]["hit_rate"] > rows["least_load"]["hit_rate"] + 0.1
    assert rows["sglang-router"]["ttft_p90_s"]["mean"] < \
        0.9 * rows["least_load"]["ttft_p90_s"]["mean"]
