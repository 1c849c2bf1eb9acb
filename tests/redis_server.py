"""A real ``redis-server`` for the store tests: started on a free loopback port with its own
temporary folder and no persistence files outside it. Skips when the server is missing
outside CI and fails in CI (where ``.ci/run`` installs Debian's ``redis-server``)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import missing


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(folder: Path, *, port: int | None = None,
                persist: bool = True) -> tuple[subprocess.Popen, str]:
    """A running server and its URL (database 0): on ``port`` (default: a free one), with
    every write in its append-only file, or (``persist`` false) as a cache that keeps
    nothing across a restart."""
    binary = shutil.which("redis-server")
    if binary is None:
        missing("the Redis store tests need redis-server (apt-get install redis-server)")
    pytest.importorskip("redis", reason="the Redis store needs redis-py (the serve extra)")
    import redis

    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port() if port is None else port
    keep = ["--appendonly", "yes", "--appendfsync", "always"] if persist else \
        ["--appendonly", "no"]
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
         "--save", "", *keep, "--protected-mode", "yes", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 30
    while True:
        try:
            redis.Redis.from_url(url, socket_timeout=1).ping()
            return process, url
        except redis.RedisError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("redis-server did not start") from None
            time.sleep(0.05)


@pytest.fixture
def redis_url(tmp_path) -> Iterator[str]:
    process, url = start_redis(tmp_path / "redis")
    yield url
    process.terminate()
    process.wait(timeout=30)
