"""Helpers the test files share (import them from here, never from another test file): what a
test needs and may lack fails in CI and skips elsewhere."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NoReturn

import pytest

from canopy import data

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def missing(message: str, *, module: bool = False) -> NoReturn:
    """Fail in CI, where everything is installed, and skip elsewhere (the whole module when
    ``module``)."""
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=module)


def require_data(name: str, file: str = "") -> Path:
    """Path of a mirrored data file; fails in CI and skips elsewhere when it is missing."""
    try:
        return data.path(name, file, download=False)
    except data.DataNotFound as absent:
        missing(str(absent))


def real_sglang() -> Any:
    """SGLang's API; where it does not import, the test fails when ``CANOPY_SGLANG=required``
    (CI's run in the environment of ``.ci/sglang.sh``) and skips elsewhere."""
    try:
        from canopy.apps.cache.sglang_replay import sglang_api

        return sglang_api()
    except ImportError as missing:
        if os.environ.get("CANOPY_SGLANG") == "required":
            pytest.fail(f"SGLang missing where it is required (.ci/sglang.sh): {missing}")
        pytest.skip(f"SGLang is not installed here (its environment: .ci/sglang.sh): {missing}")
