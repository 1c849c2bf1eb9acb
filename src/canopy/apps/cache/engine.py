"""Moved to :mod:`canopy.engines.llama_cache` (the policy's prompt cache) and
:mod:`canopy.engines.llama_server` (the server), which ``canopy cache live`` and
``canopy fleet bench`` share; this path warns and goes in the next release."""

from canopy._lazy import deprecated_aliases

deprecated_aliases(__name__, {"PolicyStateCache": "canopy.engines.llama_cache",
                              "kv_bytes_per_token": "canopy.engines.llama_cache",
                              "main": "canopy.engines.llama_server"})

if __name__ == "__main__":  # python -m canopy.apps.cache.engine: the server, as before
    from canopy.engines.llama_server import main

    main()
