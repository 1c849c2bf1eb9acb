"""Errors shared across Canopy's applications."""

from __future__ import annotations

__all__ = ["EngineError", "MissingExtra"]


class EngineError(RuntimeError):
    """An engine process a command depends on (a model server, an inference engine) could not
    be found, started or reached. The message's first line names the problem; further lines,
    if any, are the engine's own output."""


class MissingExtra(ImportError):
    """An optional package a feature needs is not installed; the message names the
    ``pip install`` that adds it (the command line prints it as one line)."""
