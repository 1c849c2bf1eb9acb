"""``python -m canopy.engines.llama_server --policy canopy --capacity-mb 8 ...``: llama.cpp
serving one model with a Canopy policy's prompt cache
(:class:`~canopy.engines.llama_cache.PolicyStateCache`).

It is llama-cpp-python's own OpenAI-compatible server (``llama_cpp.server``) with the cache
swapped in, on 127.0.0.1, requiring the key in ``CANOPY_SERVER_API_KEY`` (``--no-auth``: none,
on a trusted host). Beside the OpenAI routes: ``GET /canopy/cache``, the cache's statistics
and each request's reused blocks; ``GET /health``, the readiness probe routers send before
they route (vllm-router waits for it at start). A request that finds the model busy waits for
it: llama-cpp-python's default ends the stream in flight when the next request arrives, which
a router with several requests in flight would see as a failure.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from canopy.data import jsonl_rows
from canopy.engines.llama_cache import PolicyStateCache, kv_bytes_per_token

__all__ = ["main"]


def _serve(args: argparse.Namespace) -> None:
    import uvicorn
    from fastapi import Depends
    from llama_cpp.server import app as server_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    key = os.environ.get("CANOPY_SERVER_API_KEY")
    if not key and not args.no_auth:
        raise SystemExit("set CANOPY_SERVER_API_KEY (or pass --no-auth on a trusted host)")
    app = server_app.create_app(
        server_settings=ServerSettings(host=args.host, port=args.port, api_key=key or None,
                                       interrupt_requests=False),
        model_settings=[ModelSettings(model=args.model, model_alias=args.model_alias,
                                      n_ctx=args.n_ctx, n_threads=args.n_threads,
                                      n_threads_batch=args.n_threads, verbose=False)])
    llama = server_app._llama_proxy(args.model_alias)  # the loaded engine
    policy = None if args.policy == "off" else args.policy
    plan = None if args.plan is None else [row for _, row in jsonl_rows(args.plan,
                                                                         objects=False)]
    cache = PolicyStateCache(policy, int(args.capacity_mb * 2**20),
                             block_tokens=args.block_tokens, kv_bytes=kv_bytes_per_token(llama),
                             plan=plan).bind(llama)

    @app.get("/canopy/cache", dependencies=[Depends(server_app.authenticate)])
    def cache_stats() -> dict[str, Any]:
        return cache.stats()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    # on SIGTERM/SIGINT: a completion in flight gets one second, then the process ends (a
    # llama.cpp call in a worker thread would otherwise hold it open)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=1)
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m canopy.engines.llama_server``: the llama.cpp server with a policy cache."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--model", required=True, help="GGUF file")
    parser.add_argument("--model_alias", default="smollm2-135m")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--n_ctx", type=int, default=2048)
    parser.add_argument("--n_threads", type=int, default=1)
    parser.add_argument("--policy", default="canopy",
                        help="off, lru, lfu, sieve, canopy, optimal (needs --plan), or "
                        "package.module:ClassName (a policy of your own)")
    parser.add_argument("--plan", help="the prompts to come, one JSON list of token ids a "
                        "line (in order; prompts without a full block may come between)")
    parser.add_argument("--capacity-mb", type=float, default=64.0)
    parser.add_argument("--block-tokens", type=int, default=16)
    parser.add_argument("--no-auth", action="store_true")
    _serve(parser.parse_args(argv))


if __name__ == "__main__":
    main()
