"""The gateway: the routing proxy in front of several replicas of one model, over real HTTP
on 127.0.0.1 against scripted replicas, and its KV-event subscriber against a real ZMQ
publisher sending msgpack batches as vLLM's ``ZmqEventPublisher`` does."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest

pytest.importorskip("fastapi")
zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

from canopy.apps.routing.proxy.app import create_app, serve_in_thread  # noqa: E402
from canopy.apps.routing.proxy.config import ProxyConfig  # noqa: E402
from canopy.fleet import ReplicaIndex  # noqa: E402
from canopy.fleet.policies import LEARNT_GRID  # noqa: E402
from canopy.fleet.subscriber import EventSource, EventSubscriber  # noqa: E402
from canopy.fleet.tokens import PromptTokenizer, chain_keys  # noqa: E402

CLIENT_KEY, ADMIN_KEY = "client-gateway-key-1", "admin-gateway-key-2"
CLIENT = {"Authorization": f"Bearer {CLIENT_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PRICES = {"version": "test-1", "models": {"fleet": {"input": 1.0, "output": 1.0}}}


@pytest.fixture(autouse=True)
def keys(monkeypatch):
    monkeypatch.setenv("GW_CLIENT_KEY", CLIENT_KEY)
    monkeypatch.setenv("GW_ADMIN_KEY", ADMIN_KEY)


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Replica:
    """A scripted engine replica: ``GET /v1/models``, chats (streamed or not) answered with
    its name; ``stop()`` then ``start()`` brings it back on the same port. ``die_after``:
    a stream is cut after its first event; ``cached_tokens``: what its usage reports."""

    def __init__(self, name: str, port: int | None = None) -> None:
        self.name, self.port = name, port or _port()
        self.served: Counter[str] = Counter()
        self.cached_tokens = 0
        self.die_mid_stream = False
        self._server: ThreadingHTTPServer | None = None

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Replica:
        replica = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, body: bytes, kind: str = "application/json") -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True  # a stopped replica answers nothing more

            def do_GET(self) -> None:
                self._send(json.dumps({"data": [{"id": "m"}]}).encode())

            def do_POST(self) -> None:
                asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                replica.served["chat"] += 1
                usage = {"prompt_tokens": 10, "completion_tokens": 2,
                         "prompt_tokens_details": {"cached_tokens": replica.cached_tokens}}
                if not asked.get("stream"):
                    self._send(json.dumps({"choices": [{"message": {
                        "role": "assistant", "content": replica.name}}], "usage": usage})
                        .encode())
                    return
                chunk = {"choices": [{"delta": {"content": replica.name}}]}
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def write(data: bytes) -> None:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()

                write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.close_connection = True
                if replica.die_mid_stream:  # the process dies: no last chunk
                    time.sleep(0.2)
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                      "data: [DONE]\n\n".encode())
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, format: str, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@pytest.fixture
def replicas():
    started = [Replica("r0").start(), Replica("r1").start()]
    yield started
    for replica in started:
        replica.stop()


def config(replicas, *, policy="round_robin", index=None, **extra) -> dict:
    return {"upstreams": [{"model": "fleet", "replicas": [r.url() for r in replicas],
                           "replica_policy": policy, "index": index or {}, "timeout_s": 5,
                           **extra}],
            "store": "memory", "prices": PRICES,
            "auth": {"client_key_env": "GW_CLIENT_KEY", "admin_key_env": "GW_ADMIN_KEY"}}


def ask(url: str, text: str = "hello there", **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", headers=CLIENT, timeout=10,
                      json={"messages": [{"role": "user", "content": text}], **body})


def test_replicas_are_chosen_per_request_and_counted(replicas):
    app = create_app(ProxyConfig.from_mapping(config(replicas)))
    with serve_in_thread(app, startup_timeout=120) as url:
        answers = [ask(url).json()["choices"][0]["message"]["content"] for _ in range(6)]
        metrics = httpx.get(f"{url}/metrics", headers=ADMIN).text
    assert Counter(answers) == {"r0": 3, "r1": 3}  # round robin
    assert "canopy_replica_picks_total" in metrics and replicas[1].url() in metrics


def test_the_canopy_policy_keeps_a_prefix_where_it_is_cached(replicas):
    """Approximate index: the same long prompt twice goes to the same replica."""
    app = create_app(ProxyConfig.from_mapping(config(
        replicas, policy="canopy", index={"mode": "approximate", "block_size": 4})))
    prompt = "a long shared system prompt " * 20
    with serve_in_thread(app, startup_timeout=120) as url:
        first = [ask(url, prompt).json()["choices"][0]["message"]["content"]
                 for _ in range(4)]
    assert len(set(first)) == 1


def test_metrics_show_the_tradeoff_the_canopy_policy_plays_in_each_region(replicas):
    """``/metrics`` gains, per region the ``canopy`` policy has met, the ``theta`` it plays
    there now (the arm of its highest index): outcomes whose TTFT is lowest under one theta
    move that region's gauge to it."""
    from canopy.fleet.policies import region_path

    app = create_app(ProxyConfig.from_mapping(config(
        replicas, policy="canopy", index={"mode": "approximate", "block_size": 4})))
    pool = app.state.proxy.upstreams["fleet"]
    prompt = "a system prompt whose region learns " * 4
    keys, _ = pool.tokenizer.keys({"messages": [{"role": "user", "content": prompt}]},
                                  pool.block_size)
    region = region_path(keys)
    with serve_in_thread(app, startup_timeout=120) as url:
        for _ in range(40):  # the trade-off 3 answers fastest here
            with pool.shared.reading() as router:
                for theta in LEARNT_GRID:
                    router.update(region, f"{theta:g}", 0.0, 0.1 if theta == 3.0 else 1.0)
        metrics = httpx.get(f"{url}/metrics", headers=ADMIN).text
    gauges = {line.split("region=")[1].split('"')[1]: float(line.rsplit(" ", 1)[1])
              for line in metrics.splitlines() if line.startswith("canopy_replica_tradeoff{")}
    assert gauges[region] == 3.0 and set(gauges) >= {"/", region}


def test_a_replica_killed_mid_run_loses_no_request_and_leaves_the_index(replicas):
    app = create_app(ProxyConfig.from_mapping(config(
        replicas, policy="least_load", index={"mode": "approximate", "block_size": 4})))
    pool = app.state.proxy.upstreams["fleet"]
    with serve_in_thread(app, startup_timeout=120) as url:
        statuses = [ask(url, f"prompt {i} " * 8).status_code for i in range(4)]
        replicas[1].stop()
        statuses += [ask(url, f"prompt {i} " * 8).status_code for i in range(4, 12)]
        held = [pool.index.match(pool.pick({"messages": [{"role": "user", "content":
                                                           f"prompt {i} " * 8}]}).keys)
                for i in range(12)]
        assert pool.up == [True, False]
        replicas[1].start()  # the same port: the probe re-admits it
        for _ in range(100):
            if pool.up[1]:
                break
            time.sleep(0.05)
        assert pool.up[1]
        answers = Counter(ask(url, f"again {i}").json()["choices"][0]["message"]["content"]
                          for i in range(6))
    assert statuses == [200] * 12
    assert all(h[1] == 0 for h in held)  # the dead replica left the index at its failure
    assert answers["r1"] > 0


def test_a_stream_whose_replica_dies_ends_with_an_error_event(replicas):
    replicas[0].die_mid_stream = replicas[1].die_mid_stream = True
    app = create_app(ProxyConfig.from_mapping(config(replicas)))
    with serve_in_thread(app, startup_timeout=120) as url:
        with httpx.stream("POST", f"{url}/v1/chat/completions", headers=CLIENT, timeout=10,
                          json={"messages": [{"role": "user", "content": "hi"}],
                                "stream": True}) as response:
            text = b"".join(response.iter_raw()).decode()
    assert '"content": "r' in text and '"error"' in text.rsplit("data:", 1)[1]


def test_bad_replica_configurations_are_refused():
    base = config([Replica("a"), Replica("b")])
    for change, needle in (({"replica_policy": "best"}, "unknown replica policy"),
                           ({"base_url": "http://127.0.0.1:1/v1"}, "not one of its replicas"),
                           ({"index": {"mode": "precise"}}, "events_endpoint"),
                           ({"index": {"colour": 1}}, "'index' takes")):
        data = json.loads(json.dumps(base))
        data["upstreams"][0].update(change)
        with pytest.raises(ValueError, match=needle):
            ProxyConfig.from_mapping(data)


def test_every_replica_option_the_config_accepts_is_a_keyword_of_make_policy():
    import inspect

    from canopy.apps.routing.proxy.config import POLICY_OPTIONS
    from canopy.fleet import make_policy

    keywords = set(inspect.signature(make_policy).parameters)
    assert POLICY_OPTIONS <= keywords, sorted(POLICY_OPTIONS - keywords)
    data = config([Replica("a"), Replica("b")], policy="canopy")
    data["upstreams"][0]["replica_options"] = {"overhead_tokens": 50.0, "explore": 0.5}
    upstream = ProxyConfig.from_mapping(data).upstreams[0]
    policy = make_policy(upstream.replica_policy, **upstream.replica_options)
    assert policy.params[1] == 50.0 and policy.router.explore == 0.5


def test_the_cli_refuses_a_model_none_of_whose_replicas_answers(tmp_path):
    path = tmp_path / "router.json"
    path.write_text(json.dumps(config([Replica("a"), Replica("b")])))
    done = subprocess.run([sys.executable, "-m", "canopy", "serve", "router", "--config",
                           str(path), "--port", str(_port())], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": ":".join(sys.path), "PATH": "",
                                            "GW_CLIENT_KEY": "k", "GW_ADMIN_KEY": "a"})
    assert done.returncode == 2
    assert "no replica of 'fleet' answers" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# -- KV events ---------------------------------------------------------------------------
@pytest.fixture
def tokenizer_file(tmp_path):
    """A small local word-level tokenizer (nothing from a hub)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = "user assistant hello there a long shared system prompt the cat sat".split()
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def _batch(events, ts=None) -> bytes:
    return msgpack.packb([time.time() if ts is None else ts, events])


def _stored(tokens, block_size, parent=None, first_hash=1000):
    n = len(tokens) // block_size
    return {"type": "BlockStored", "block_hashes": list(range(first_hash, first_hash + n)),
            "parent_block_hash": parent,
            "token_ids": [int(t) for t in tokens[:n * block_size]],
            "block_size": block_size, "lora_id": None, "medium": "GPU"}


async def _settle(condition, seconds=2.0):
    for _ in range(int(seconds / 0.01)):
        if condition():
            return True
        await asyncio.sleep(0.01)
    return condition()


def test_events_from_a_real_zmq_publisher_fill_the_index(tokenizer_file, caplog):
    """BlockStored keyed on its token ids matches the request's keys; a malformed or
    foreign message is dropped, counted and logged once; the next good one is applied."""
    tok = PromptTokenizer(tokenizer_file)
    body = {"messages": [{"role": "user", "content": "a long shared system prompt " * 4}]}
    ids = tok.ids(body)
    keys, _ = tok.keys(body, 4)
    endpoint = f"tcp://127.0.0.1:{_port()}"

    async def main():
        index = ReplicaIndex(2)
        sub = EventSubscriber(index, [EventSource(1, endpoint, "kv", None, 4)])
        sub.start()
        pub = zmq.asyncio.Context.instance().socket(zmq.PUB)
        pub.connect(endpoint)
        await asyncio.sleep(0.3)  # the slow joiner
        half = len(ids) // 8 * 4
        await pub.send_multipart([b"kv", (0).to_bytes(8, "big"),
                                  _batch([_stored(ids[:half], 4)])])
        await pub.send_multipart([b"kv", (1).to_bytes(8, "big"), b"\xc1garbage"])
        await pub.send_multipart([b"kv", (2).to_bytes(8, "big"), b"\xc1again"])
        await pub.send_multipart([b"other", (3).to_bytes(8, "big"), _batch([])])
        await pub.send_multipart([b"kv", (3).to_bytes(8, "big"), _batch(
            [_stored(ids[half:], 4, parent=1000 + half // 4 - 1, first_hash=2000)])])
        assert await _settle(lambda: index.match(keys)[1] == keys.size)
        pub.close()
        await sub.aclose()
        return index, sub

    with caplog.at_level(logging.WARNING, logger="canopy.fleet.events"):
        index, sub = asyncio.run(main())
    assert index.match(keys).tolist() == [0, keys.size]
    assert sub.dropped["malformed"] == 2
    assert sum("malformed" in r.getMessage() for r in caplog.records) == 1
    assert keys.tolist() == chain_keys(ids, 4).tolist()


def test_a_sequence_gap_is_replayed_or_drops_to_approximate(tokenizer_file, caplog):
    ids = np.arange(1, 33)
    endpoint, replay = f"tcp://127.0.0.1:{_port()}", f"tcp://127.0.0.1:{_port()}"
    batches = {s: _batch([_stored(ids[8 * s:8 * s + 8], 4, None if s == 0 else 100 * s - 98,
                                  first_hash=100 * s + 1)]) for s in range(4)}
    lost: list[int] = []

    async def main(with_replay: bool):
        index = ReplicaIndex(1)
        ctx = zmq.asyncio.Context.instance()
        router = ctx.socket(zmq.ROUTER)
        router.bind(replay)

        async def serve_replay():
            client, _, start = await router.recv_multipart()
            for s in range(int.from_bytes(start, "big"), 4):
                await router.send_multipart([client, b"", s.to_bytes(8, "big"), batches[s]])
            await router.send_multipart([client, b"", (-1).to_bytes(8, "big", signed=True),
                                         b""])

        server = asyncio.get_running_loop().create_task(serve_replay())
        sub = EventSubscriber(index, [EventSource(0, endpoint, "", replay if with_replay
                                                  else None, 4)], on_gap_lost=lost.append)
        sub.start()
        pub = ctx.socket(zmq.PUB)
        pub.connect(endpoint)
        await asyncio.sleep(0.3)
        for s in (0, 3):  # 1 and 2 never arrive
            await pub.send_multipart([b"", s.to_bytes(8, "big"), batches[s]])
        await _settle(lambda: index.last_seq[0] == 3 or sub.lost)
        server.cancel()
        pub.close()
        router.close()
        await sub.aclose()
        return index, sub

    index, sub = asyncio.run(main(True))
    assert index.match(chain_keys(ids, 4)).tolist() == [8] and not lost
    with caplog.at_level(logging.WARNING, logger="canopy.fleet.events"):
        index, sub = asyncio.run(main(False))
    assert sub.lost and lost == [0]
    assert sum("drops to approximate" in r.getMessage() for r in caplog.records) == 1


def test_a_remote_events_endpoint_is_refused_unless_allowed():
    with pytest.raises(ValueError, match="not loopback"):
        EventSubscriber(ReplicaIndex(1), [EventSource(0, "tcp://0.0.0.0:5557")])


def test_a_precise_gateway_routes_to_the_replica_its_events_say_holds_the_prefix(
        replicas, tokenizer_file):
    endpoints = [f"tcp://127.0.0.1:{_port()}" for _ in replicas]
    data = config(replicas, policy="dynamo",
                  index={"mode": "precise", "block_size": 4, "tokenizer": str(tokenizer_file)})
    data["upstreams"][0]["replicas"] = [
        {"url": r.url(), "events_endpoint": e, "events_topic": "kv"}
        for r, e in zip(replicas, endpoints, strict=True)]
    app = create_app(ProxyConfig.from_mapping(data))
    pool = app.state.proxy.upstreams["fleet"]
    text = "a long shared system prompt " * 6
    body = {"messages": [{"role": "user", "content": text}]}
    ids = PromptTokenizer(tokenizer_file).ids(body)
    with serve_in_thread(app, startup_timeout=120) as url:
        pub = zmq.Context.instance().socket(zmq.PUB)
        pub.connect(endpoints[1])
        time.sleep(0.5)  # the slow joiner
        pub.send_multipart([b"kv", (0).to_bytes(8, "big"), _batch([_stored(ids, 4)])])
        for _ in range(200):
            if pool.index.n_blocks:
                break
            time.sleep(0.01)
        # the engine reports what the index predicted: the full blocks before the last token
        replicas[1].cached_tokens = (ids.size - 1) // 4 * 4
        answers = [ask(url, text).json()["choices"][0]["message"]["content"] for _ in range(3)]
        replicas[1].cached_tokens = 4  # then less than predicted
        answers.append(ask(url, text).json()["choices"][0]["message"]["content"])
        metrics = httpx.get(f"{url}/metrics", headers=ADMIN).text
        pub.close()
    assert answers == ["r1"] * 4
    assert "canopy_index_blocks" in metrics
    assert 'canopy_cache_predictions_total{model="fleet",outcome="exact"} 3.0' in metrics
    assert 'canopy_cache_predictions_total{model="fleet",outcome="over"} 1.0' in metrics


def test_the_chat_template_beside_the_tokenizer_is_rendered_before_tokenizing(
        tokenizer_file):
    """With ``tokenizer_config.json``'s template the ids are the rendered text's, so two
    chats differing only in their roles get different keys."""
    template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant\n{% endif %}")
    (tokenizer_file.parent / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template}))
    tok = PromptTokenizer(tokenizer_file.parent)
    ids = tok.ids({"messages": [{"role": "user", "content": "hello there"}]})
    assert ids.tolist() == tok._tokenizer.encode("user hello there\nassistant\n",
                                                 add_special_tokens=False).ids


# -- gateways on one store ---------------------------------------------------------------
def _stream(url: str, text: str) -> None:
    with httpx.stream("POST", f"{url}/v1/chat/completions", headers=CLIENT, timeout=10,
                      json={"messages": [{"role": "user", "content": text}],
                            "stream": True}) as response:
        assert response.status_code == 200
        b"".join(response.iter_raw())


def _tradeoff(pool, region: str) -> tuple[dict[str, int], float]:
    """The pool's trade-off statistics in ``region`` (pulled from the store first): each
    theta's count, and the theta its policy would use there now."""
    shared = pool.shared
    for _ in range(200):  # a circuit opened by a restart closes on its probe's next answer
        try:
            shared.sync()
            break
        except Exception:  # StoreDown, StoreBusy: probed again in the background
            time.sleep(0.05)
    counts = {row["model"]: row["count"] for row in shared.estimates()
              if row["region"] == region}
    with shared.reading() as router:
        return counts, float(router.grid[router.arm(region)])


def test_gateways_on_one_redis_use_the_tradeoff_either_learns(replicas, tmp_path):
    """Two gateways, one Redis, the same two replicas: streams through A teach A's trade-off
    for their region; B, which served none of them, holds the same counts and chooses the
    same theta there. Redis restarted empty: A re-seeds what it knew, B adopts it, and a
    stream through B reaches A."""
    from canopy.fleet.policies import region_path
    from redis_server import start_redis

    server, url = start_redis(tmp_path / "redis", persist=False)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    data = config(replicas, policy="canopy", index={"mode": "approximate", "block_size": 4})
    data["store"] = url
    apps = [create_app(ProxyConfig.from_mapping(data)) for _ in range(2)]
    pools = [app.state.proxy.upstreams["fleet"] for app in apps]
    prompt = "a system prompt both gateways see " * 4
    keys, _ = pools[0].tokenizer.keys({"messages": [{"role": "user", "content": prompt}]},
                                      pools[0].block_size)
    region = region_path(keys)
    try:
        with serve_in_thread(apps[0], startup_timeout=120) as one, \
                serve_in_thread(apps[1], startup_timeout=120) as two:
            fresh_counts, fresh_theta = _tradeoff(pools[1], region)
            for _ in range(12):
                _stream(one, prompt)
            learnt = _tradeoff(pools[0], region)
            shared = _tradeoff(pools[1], region)
            ask(two, prompt)  # B routes the region with the shared statistics
            used = float(pools[1].policy.params[0])
            server.kill()  # -9, no persistence: the store comes back empty
            server.wait(timeout=30)
            server, _ = start_redis(tmp_path / "redis", port=port, persist=False)
            kept = [_tradeoff(pool, region) for pool in pools]
            _stream(two, prompt)
            after = [_tradeoff(pool, region) for pool in pools[::-1]]  # B's flush, A's read
    finally:
        server.kill()
        server.wait(timeout=30)
    assert sum(fresh_counts.values()) == 0 and fresh_theta == LEARNT_GRID[0]
    assert sum(learnt[0].values()) == 12 and min(learnt[0].values()) >= 1  # every theta tried
    assert shared == learnt and used == learnt[1]
    assert kept == [learnt, learnt]
    assert [sum(counts.values()) for counts, _ in after] == [13, 13]
    assert after[0] == after[1]


def test_an_approximate_index_keys_a_repeated_prompt_once_within_a_bounded_cache(
        monkeypatch):
    """Without a tokenizer the keys of a prompt seen before come from a cache (bounded by
    the bytes of text it holds), equal to the keys computed afresh."""
    import canopy.fleet.tokens as tokens

    computed: list[int] = []
    real = tokens.chain_keys

    def counted(ids, block_size, parent=0):
        computed.append(len(ids))
        return real(ids, block_size, parent)

    monkeypatch.setattr(tokens, "chain_keys", counted)
    tok = PromptTokenizer()
    body = {"messages": [{"role": "user", "content": "x" * 300}]}
    first, again = tok.keys(body, 16), tok.keys(body, 16)
    assert len(computed) == 1 and first[1] == again[1]
    assert first[0].tolist() == again[0].tolist() == real(tok.ids(body), 64).tolist()
    assert tok.keys(body, 8)[0].size > first[0].size and len(computed) == 2  # its own key
    monkeypatch.setattr(tokens, "KEY_CACHE_BYTES", 1000)
    tok = PromptTokenizer()
    for n in range(20):
        tok.keys({"prompt": f"{n:03d}" + "y" * 200}, 16)
    assert tok.cached_bytes <= 1000
    computed.clear()
    tok.keys({"prompt": "019" + "y" * 200}, 16)
    tok.keys({"prompt": "000" + "y" * 200}, 16)
    assert len(computed) == 1  # the newest is kept, the oldest was dropped


def test_metrics_reach_the_registry_in_batches_and_whole_at_every_scrape():
    """A chat's counts wait in the proxy (a few dictionary updates, no lock per metric) and
    reach Prometheus' registry every 256 chats or when ``/metrics`` is read, never lost."""
    from canopy.apps.routing.proxy.metrics import ProxyMetrics

    metrics = ProxyMetrics()

    def sample(name, **labels):
        return metrics.registry.get_sample_value(name, labels) or 0.0

    for n in range(10):
        metrics.chat(200 if n else 503, "small" if n else None, 0.01)
        metrics.count(metrics.replica_picks, "small", "http://a")
    assert sample("canopy_requests_total", status="200") == 0.0  # not yet in the registry
    text = metrics.exposition().decode()
    assert 'canopy_requests_total{status="200"} 9.0' in text
    assert 'canopy_requests_total{status="503"} 1.0' in text
    assert sample("canopy_choices_total", model="small") == 9.0
    assert sample("canopy_request_seconds_count") == 10.0
    assert sample("canopy_replica_picks_total", model="small", replica="http://a") == 10.0
    for _ in range(300):
        metrics.chat(200, "small", 0.01)
    assert 9.0 + 256 <= sample("canopy_requests_total", status="200") < 9.0 + 300
    metrics.exposition()
    assert sample("canopy_requests_total", status="200") == 309.0
