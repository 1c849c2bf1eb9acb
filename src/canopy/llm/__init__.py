"""LLM endpoints: the OpenAI-compatible client (:class:`LLMClient`, with a usage record and an
on-disk response cache) and a local llama-cpp-python server for tests
(:class:`~canopy.llm.local.LocalLlamaServer`, imported from :mod:`canopy.llm.local`).

Needs the ``llm`` extra (httpx).
"""

from canopy.llm.client import (
    LLMClient,
    LLMConnectionError,
    LLMError,
    LLMResponse,
    LLMResponseError,
    LLMServerError,
    LLMTimeoutError,
    ResponseCache,
    Usage,
)

__all__ = [
    "LLMClient",
    "LLMConnectionError",
    "LLMError",
    "LLMResponse",
    "LLMResponseError",
    "LLMServerError",
    "LLMTimeoutError",
    "ResponseCache",
    "Usage",
]
