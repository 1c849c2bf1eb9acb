"""Errors shared across Canopy's applications."""

from __future__ import annotations

__all__ = ["EngineError"]


class EngineError(RuntimeError):
    """An engine process a command depends on (a model server, an inference engine) could not
    be found, started or reached. The message's first line names the problem; further lines,
    if any, are the engine's own output."""
