"""Live engines on loopback and the workloads sent to them, shared by the applications that
measure real engines (``canopy cache live``, ``canopy fleet bench``): vLLM's server
(:mod:`~canopy.engines.vllm_server`), llama.cpp with a Canopy policy's prompt cache
(:mod:`~canopy.engines.llama_cache`, served by :mod:`~canopy.engines.llama_server`), the
process tree under a server (:mod:`~canopy.engines.processes`) and the shared-prefix
workloads (:mod:`~canopy.engines.workloads`)."""

from canopy._lazy import lazy_exports

_EXPORTS = {
    "PolicyStateCache": "canopy.engines.llama_cache",
    "kv_bytes_per_token": "canopy.engines.llama_cache",
    "VLLMServer": "canopy.engines.vllm_server",
    "VLLMServerError": "canopy.engines.vllm_server",
    "model_folder": "canopy.engines.vllm_server",
    "vllm_python": "canopy.engines.vllm_server",
    "Workload": "canopy.engines.workloads",
    "mooncake_workload": "canopy.engines.workloads",
    "word_vocabulary": "canopy.engines.workloads",
    "zipf_workload": "canopy.engines.workloads",
}

__all__ = sorted(_EXPORTS)

lazy_exports(__name__, _EXPORTS)
