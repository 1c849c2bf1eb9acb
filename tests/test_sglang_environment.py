"""The tests marked ``sglang`` (``tests/test_cache_sglang.py``,
``tests/test_cache_failsafe.py``), run by the main suite inside SGLang's own environment:
SGLang pins a CUDA build of torch that cannot share an environment with the rest of the
project, so ``.ci/sglang.sh`` makes ``.venv-sglang`` (or the folder ``CANOPY_SGLANG_VENV``
names) and this test runs them there, with ``CANOPY_SGLANG=required`` so that none of them
may skip for want of SGLang (in CI none may skip at all). Without that environment it skips,
and fails in CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import IN_CI, missing

ROOT = Path(__file__).resolve().parents[1]


def _sglang_python() -> Path:
    venv = Path(os.environ.get("CANOPY_SGLANG_VENV", ROOT / ".venv-sglang"))
    python = venv / "bin" / "python"
    if python.exists() and (venv / ".canopy-sglang-ready").exists():
        return python
    missing(f"SGLang's environment {venv} is missing (bash .ci/sglang.sh makes it)")


@pytest.mark.skipif(sys.platform != "linux", reason="SGLang's environment is built on Linux")
def test_the_sglang_tests_pass_inside_sglangs_environment(tmp_path):
    python = _sglang_python()
    env = {**os.environ, "CANOPY_SGLANG": "required",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [str(python), "-m", "pytest", "tests/test_cache_sglang.py", "tests/test_cache_failsafe.py",
         "-m", "sglang", "-q",
         "-p", "no:cacheprovider", "--junitxml", str(tmp_path / "sglang.xml")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    report = (tmp_path / "sglang.xml").read_text() if (tmp_path / "sglang.xml").exists() else ""
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert 'failures="0"' in report and 'tests="0"' not in report, report[:2000]
    if IN_CI:  # elsewhere a test that needs the data mirror may skip without it
        assert 'skipped="0"' in report, report[:2000]
    print("\n" + run.stdout.strip().splitlines()[-1])
