"""``python -m canopy.apps.fleet.llama_replica``: the llama.cpp server of
:mod:`canopy.apps.cache.engine` (same arguments) with ``GET /health``, the readiness probe the
peer routers send before they route (vllm-router waits for it at start whatever its
``--health-check-endpoint``; llama-cpp-python's server has no such route), and requests
queued while the model is busy: by default llama-cpp-python's server ends the stream in
flight when the next request arrives, which routers with several requests in flight see
as a failure."""

from __future__ import annotations

from typing import Any


def main() -> None:
    """Patch the app llama-cpp-python's server creates (see the module docstring), then run
    the engine."""
    from llama_cpp.server import app as server_app

    from canopy.apps.cache.engine import main as engine_main

    create = server_app.create_app

    def create_app(*args: Any, **kwargs: Any) -> Any:
        settings = kwargs.get("server_settings")
        if settings is not None:  # queue a request that finds the model busy, never cut
            settings.interrupt_requests = False  # the stream in flight (the default)
        app = create(*args, **kwargs)
        app.get("/health")(lambda: {"status": "ok"})
        return app

    server_app.create_app = create_app
    engine_main()


if __name__ == "__main__":
    main()
