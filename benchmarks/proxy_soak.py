"""Soak of the routing proxy: ``canopy serve router`` (its own process, a SQLite store)
serving ``--requests`` chats, ``--concurrency`` at a time, each rated, against two scripted
upstreams on loopback, its resident memory (the process and its children, from
``/proc/<pid>/statm``) sampled every ``--every`` seconds through the run::

    nice -n 10 python benchmarks/proxy_soak.py --requests 50000 --concurrency 32 \\
        --json soak.json --png docs/proxy-soak.png

prints (and writes to ``--json``) the memory curve and the checks: resident memory over the
second half of the run against the first half's end (target: within 5%), and the p99
latency of the last 10% of requests against the 10% after warm-up (target: within 20%).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

ADMIN = "soak-admin-key-123"
PAGE = os.sysconf("SC_PAGE_SIZE")


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from ``/proc``."""
    out, todo = [], [pid]
    while todo:
        one = todo.pop()
        out.append(one)
        for task in Path(f"/proc/{one}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return out


def resident_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants."""
    total = 0
    for one in _tree(pid):
        try:
            total += int(Path(f"/proc/{one}/statm").read_text().split()[1]) * PAGE
        except OSError:
            continue
    return total


def soak(requests: int, concurrency: int, every: float) -> dict[str, object]:
    """Run the soak; the samples and the checks."""
    import httpx

    from canopy.apps.routing.proxy.loadtest import run_load_test
    from llm_server import ScriptedServer

    chat = ScriptedServer.chat_body("hi", prompt_tokens=10, completion_tokens=2)
    servers = [ScriptedServer().start(), ScriptedServer().start()]
    for server in servers:  # the scripted server keeps every body: forget them as they come
        server.routes["/v1/chat/completions"] = lambda _, s=server: (s.bodies.clear(),
                                                                      (200, chat, 0.0))[1]
    folder = Path(tempfile.mkdtemp(prefix="canopy-soak-"))
    config = folder / "router.json"
    config.write_text(json.dumps({
        "upstreams": [{"model": "small", "base_url": servers[0].url("/v1")},
                      {"model": "large", "base_url": servers[1].url("/v1")}],
        "store": "sqlite:///router.sqlite", "lam": 10.0,
        "prices": {"version": "soak", "models": {"small": {"input": 1.0, "output": 1.0},
                                                 "large": {"input": 50.0, "output": 50.0}}},
        "auth": {"admin_key_env": "SOAK_ADMIN_KEY"}}))
    port = _port()
    url = f"http://127.0.0.1:{port}"
    proxy = subprocess.Popen(
        [sys.executable, "-m", "canopy", "serve", "router", "--config", str(config),
         "--port", str(port)], env={**os.environ, "SOAK_ADMIN_KEY": ADMIN},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples: list[tuple[float, int]] = []
    done = threading.Event()
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        started = time.monotonic()

        def sample() -> None:
            while not done.wait(every):
                samples.append((time.monotonic() - started, resident_bytes(proxy.pid)))

        sampler = threading.Thread(target=sample, daemon=True)
        samples.append((0.0, resident_bytes(proxy.pid)))
        sampler.start()
        result = run_load_test(url, requests=requests, concurrency=concurrency,
                               regions=[f"r{i}" for i in range(8)], quality=lambda _: 0.5,
                               api_key=ADMIN, request_timeout=60.0)
        done.set()
        sampler.join()
        samples.append((time.monotonic() - started, resident_bytes(proxy.pid)))
    finally:
        done.set()
        proxy.terminate()
        proxy.wait(timeout=60)
        for server in servers:
            server.close()
    times = np.array([t for t, _ in samples])
    rss = np.array([r for _, r in samples], dtype=float) / 2**20
    half = times[-1] / 2
    first_end = float(rss[times <= half][-1])
    second = rss[times > half]
    latency = result.latency_ms
    tenth = len(latency) // 10
    warm = float(np.percentile(latency[tenth:2 * tenth], 99))  # the 10% after warm-up
    last = float(np.percentile(latency[-tenth:], 99))
    return {"requests": requests, "concurrency": concurrency,
            "answered": result.status.get(200, 0), "rated": result.feedback_status.get(200, 0),
            "client_errors": len(result.client_errors), "duration_s": result.duration_s,
            "rss_mib_start": float(rss[0]), "rss_mib_first_half_end": first_end,
            "rss_mib_second_half_max": float(second.max()),
            "rss_mib_end": float(rss[-1]),
            "rss_second_half_over_first_end": float(second.max() / first_end - 1.0),
            "p99_ms_after_warmup": warm, "p99_ms_last_tenth": last,
            "p99_last_over_warm": last / warm - 1.0,
            "curve": [[round(float(t), 2), round(float(r), 2)]
                      for t, r in zip(times, rss, strict=True)]}


def _plot(report: dict[str, object], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = np.array(report["curve"])
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(curve[:, 0], curve[:, 1])
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("proxy resident memory (MiB)")
    ax.set_title(f"{report['requests']:,} rated chats, {report['concurrency']} at a time")
    ax.set_ylim(0, curve[:, 1].max() * 1.15)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--png", type=Path, help="draw the memory curve here")
    args = parser.parse_args(argv)
    report = soak(args.requests, args.concurrency, args.every)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    if args.png is not None:
        _plot(report, args.png)
    print(json.dumps({k: v for k, v in report.items() if k != "curve"}, indent=1))


if __name__ == "__main__":
    main()
