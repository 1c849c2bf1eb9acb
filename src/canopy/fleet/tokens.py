"""A request's block keys as the gateway computes them, matching the engines' KV events.

The key of a block is a chained hash of its token ids: ``key_j = H(key_{j-1}, tokens of block
j)`` with ``key_{-1} = 0``, so a key names the whole prefix up to its block, as an engine's
block hash does, but independently of the engine's hash algorithm and seed: a ``BlockStored``
event carries the token ids, and :func:`chain_keys` keys them the same way
(:mod:`canopy.fleet.subscriber`). Only full blocks count (engines cache only full blocks).

A request is tokenized as the engine does by :class:`PromptTokenizer`: a local ``tokenizers``
JSON file and, for chats, the model's chat template (``tokenizer_config.json`` beside it,
rendered with jinja2). Without a tokenizer the keys are taken over the prompt's UTF-8 bytes
(:data:`BYTES_PER_TOKEN` bytes per token): good for an ``approximate`` index, which only
compares the gateway's own keys, never an engine's.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from canopy.prefix.hashindex import fold
from canopy.validation import check_count

__all__ = ["BYTES_PER_TOKEN", "PromptTokenizer", "chain_keys", "prompt_text"]

BYTES_PER_TOKEN = 4
"""Bytes of text per token when no tokenizer is configured (a rough English average)."""
KEY_CACHE_BYTES = 8 << 20
"""Prompt text the keys cache of a tokenizer-less :class:`PromptTokenizer` holds at most (in
characters; the least recently used prompts leave first)."""


def chain_keys(tokens: Sequence[int] | np.ndarray, block_size: int, parent: int = 0
               ) -> np.ndarray:
    """The chained int64 keys of the full blocks of ``tokens`` under the block ``parent``
    (0: the root)."""
    check_count(block_size, "block_size")
    ids = np.asarray(tokens, dtype=np.int64)
    n = ids.size // block_size
    keys = np.empty(n, dtype=np.int64)
    key = int(parent)
    for j in range(n):
        digest = hashlib.blake2b(ids[j * block_size:(j + 1) * block_size].tobytes(),
                                 digest_size=8, key=key.to_bytes(8, "big")).digest()
        key = fold(digest)
        keys[j] = key
    return keys


def prompt_text(body: Mapping[str, Any]) -> str:
    """The text a request's prompt is made of, without a chat template: the messages'
    contents in order (or a completion's ``prompt``)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    parts = []
    for message in body.get("messages") or ():
        if isinstance(message, Mapping):
            content = message.get("content")
            if isinstance(content, str):
                parts.append(f"{message.get('role', '')}\n{content}\n")
            elif isinstance(content, list):
                parts.extend(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "".join(parts)


def _byte_ids(text: str) -> np.ndarray:
    """The UTF-8 bytes of ``text`` as ids (what stands in for tokens without a tokenizer)."""
    return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int64)


def _raise(message: str) -> None:
    raise ValueError(f"the chat template refused the request: {message}")


class PromptTokenizer:
    """Token ids of a request's prompt, as the engine serving it computes them.

    ``path``: a ``tokenizer.json`` file or a directory holding one (and, for the chat
    template, ``tokenizer_config.json``); ``None``: bytes stand in for tokens
    (:data:`BYTES_PER_TOKEN` per token), and the keys of a prompt seen before come from a
    cache of at most :data:`KEY_CACHE_BYTES` of text (a repeated system prompt, a retry).
    Nothing is downloaded."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = None if path is None else Path(path)
        self._cache: OrderedDict[tuple[str, int], tuple[np.ndarray, int]] = OrderedDict()
        self.cached_bytes = 0
        self._tokenizer: Any = None
        self._template: Any = None
        self._special: dict[str, str] = {}
        if self.path is None:
            return
        file = self.path / "tokenizer.json" if self.path.is_dir() else self.path
        if not file.is_file():
            raise ValueError(f"no tokenizer file at {file}")
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(file))
        config = file.parent / "tokenizer_config.json"
        if config.is_file():
            data = json.loads(config.read_text(encoding="utf-8"))
            template = data.get("chat_template")
            if isinstance(template, str):
                import jinja2.sandbox

                env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
                                                                   lstrip_blocks=True)
                env.globals["raise_exception"] = _raise  # as transformers renders them
                self._template = env.from_string(template)
                self._special = {k: v for k, v in data.items()
                                 if k in ("bos_token", "eos_token") and isinstance(v, str)}

    @property
    def exact(self) -> bool:
        """Whether the ids are the engine's (a tokenizer is configured)."""
        return self._tokenizer is not None

    def ids(self, body: Mapping[str, Any]) -> np.ndarray:
        """The prompt's token ids (bytes without a tokenizer)."""
        if self._tokenizer is None:
            return _byte_ids(prompt_text(body))
        messages = body.get("messages")
        if self._template is not None and isinstance(messages, list):
            text = self._template.render(messages=messages, add_generation_prompt=True,
                                         **self._special)
            encoded = self._tokenizer.encode(text, add_special_tokens=False)
        else:
            encoded = self._tokenizer.encode(prompt_text(body))
        return np.asarray(encoded.ids, dtype=np.int64)

    def keys(self, body: Mapping[str, Any], block_size: int) -> tuple[np.ndarray, int]:
        """``(block keys, prompt tokens)`` of a request for ``block_size``-token blocks."""
        if self._tokenizer is not None:
            ids = self.ids(body)
            return chain_keys(ids, block_size), int(ids.size)
        text = prompt_text(body)
        found = self._cache.get((text, block_size))
        if found is not None:
            self._cache.move_to_end((text, block_size))
            return found
        ids = _byte_ids(text)
        keyed = chain_keys(ids, block_size * BYTES_PER_TOKEN), ids.size // BYTES_PER_TOKEN
        if len(text) <= KEY_CACHE_BYTES:
            self._cache[(text, block_size)] = keyed
            self.cached_bytes += len(text)
            while self.cached_bytes > KEY_CACHE_BYTES:
                (old, _), _ = self._cache.popitem(last=False)
                self.cached_bytes -= len(old)
        return keyed
