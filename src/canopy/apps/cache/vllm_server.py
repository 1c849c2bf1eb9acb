"""Moved to :mod:`canopy.engines.vllm_server`, which ``canopy cache live`` and
``canopy fleet bench`` share; this path warns and goes in the next release."""

from canopy._lazy import deprecated_aliases

deprecated_aliases(__name__, {name: "canopy.engines.vllm_server" for name in (
    "SMOLLM2_CONFIG", "VLLMServer", "VLLMServerError", "model_folder", "vllm_python")})
