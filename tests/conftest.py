"""Shared fixtures. Tests that need the data mirror fail in CI when it is missing and skip
elsewhere."""

from __future__ import annotations

import pytest

from helpers import IN_CI, require_data

__all__ = ["IN_CI", "data_file", "require_data"]  # IN_CI, require_data: for older imports

pytest_plugins = ["llm_server", "redis_server"]  # servers on loopback (tests/llm_server.py,
# tests/redis_server.py)


@pytest.fixture
def data_file():
    """``data_file(name, file)`` -> local path, per :func:`require_data`."""
    return require_data
