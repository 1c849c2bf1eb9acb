"""A real LiteLLM proxy (``litellm --config``) with Canopy loaded from its ``config.yaml``:
its callback narrows each call to the routing service's pick, ratings reach it through a
pass-through endpoint of the LiteLLM proxy forwarding to :func:`feedback_app`, and the
better-rated deployment wins. Skips when LiteLLM's proxy dependencies (``litellm[proxy]``,
not a Canopy extra) are missing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")


def _proxy_importable() -> bool:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run([sys.executable, "-c", "import litellm.proxy.proxy_server"],
                          env=env, capture_output=True, timeout=300)
    return done.returncode == 0


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(url: str, process: subprocess.Popen, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            assert process.poll() is None, "the server exited"
            assert time.monotonic() < deadline, f"{url} did not come up"
            time.sleep(0.5)


def test_a_litellm_proxy_routes_with_canopy_from_its_config(tmp_path):
    litellm_cli = shutil.which("litellm", path=os.path.dirname(sys.executable))
    if litellm_cli is None or not _proxy_importable():
        pytest.skip("the LiteLLM proxy needs litellm[proxy]'s dependencies")
    store = f"sqlite:///{tmp_path / 'litellm.sqlite'}"
    (tmp_path / "canopy_hook.py").write_text(textwrap.dedent(f"""
        from canopy.integrations.litellm import CanopyRouting
        canopy = CanopyRouting(lam=100.0, store={store!r})
    """))
    (tmp_path / "canopy_ratings.py").write_text(textwrap.dedent(f"""
        from canopy.integrations.litellm import CanopyRouting
        from canopy.integrations.litellm_feedback import feedback_app
        app = feedback_app(CanopyRouting(lam=100.0, store={store!r}),
                           admin_key_env="CANOPY_RATING_KEY")
    """))
    proxy_port, ratings_port = _port(), _port()
    deployment = {"model": "openai/m", "api_base": "http://127.0.0.1:9/v1", "api_key": "x",
                  "mock_response": "hi", "input_cost_per_token": 1e-6,
                  "output_cost_per_token": 1e-6}
    config = {"model_list": [{"model_name": "chat", "litellm_params": deployment,
                              "model_info": {"id": name}} for name in ("weak", "strong")],
              "litellm_settings": {"callbacks": "canopy_hook.canopy"},
              "general_settings": {"master_key": "sk-test-master-123", "pass_through_endpoints": [
                  {"path": "/canopy/feedback",
                   "target": f"http://127.0.0.1:{ratings_port}/v1/feedback",
                   "headers": {"Authorization": "Bearer os.environ/CANOPY_RATING_KEY"}}]}}
    (tmp_path / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "CANOPY_RATING_KEY": "rating-key-abcdefgh"}
    servers = [
        subprocess.Popen([litellm_cli, "--config", str(tmp_path / "config.yaml"), "--host",
                          "127.0.0.1", "--port", str(proxy_port)], cwd=tmp_path, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True),
        subprocess.Popen([sys.executable, "-m", "uvicorn", "canopy_ratings:app", "--host",
                          "127.0.0.1", "--port", str(ratings_port)], cwd=tmp_path, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)]
    try:
        _wait(f"http://127.0.0.1:{proxy_port}/health/liveliness", servers[0])
        _wait(f"http://127.0.0.1:{ratings_port}/docs", servers[1])
        picks, rated = [], Counter()
        with httpx.Client(base_url=f"http://127.0.0.1:{proxy_port}", timeout=60,
                          headers={"Authorization": "Bearer sk-test-master-123"}) as client:
            for _ in range(40):
                answer = client.post("/v1/chat/completions", json={
                    "model": "chat", "messages": [{"role": "user", "content": "hi"}],
                    "metadata": {"canopy_region": "code"}})
                assert answer.status_code == 200, answer.text
                picked = answer.headers["x-litellm-model-id"]
                picks.append(picked)
                deadline = time.monotonic() + 30
                while True:  # the reply is stored by the callback, after the answer
                    rating = client.post("/canopy/feedback", json={
                        "request_id": answer.json()["id"],
                        "quality": 0.9 if picked == "strong" else 0.2})
                    if rating.status_code != 404 or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                rated[rating.status_code] += 1
    finally:
        for server in servers:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
    assert rated == {200: 40}
    assert Counter(picks[-20:])["strong"] >= 16, Counter(picks)
