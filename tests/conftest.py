"""Shared fixtures. Tests that need the data mirror fail in CI when it is missing and skip
elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from canopy import data

pytest_plugins = ["llm_server", "redis_server"]  # servers on loopback (tests/llm_server.py,
# tests/redis_server.py)

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require_data(name: str, file: str = "") -> Path:
    """Path of a mirrored data file; fails in CI and skips elsewhere when it is missing."""
    try:
        return data.path(name, file, download=False)
    except data.DataNotFound as missing:
        if IN_CI:
            pytest.fail(f"data mirror incomplete in CI: {missing}")
        pytest.skip(str(missing))


@pytest.fixture
def data_file():
    """``data_file(name, file)`` -> local path, per :func:`require_data`."""
    return require_data
