"""``canopy theory check``: the theorems' symbolic identities hold and 20,000 random exact
instances give no failure; a broken check is reported, not hidden."""

from __future__ import annotations

import json
import random
from fractions import Fraction

import pytest

pytest.importorskip("sympy")

from canopy import theory
from canopy.cli import main


def test_the_cli_checks_20000_instances_with_no_failure(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["theory", "check", "--json"])
    assert exit_.value.code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["instances"] == 20_000 and report["failures"] == 0
    assert len(report["theorems"]) == 3
    for entry in report["theorems"]:
        assert entry["instances"] > 6000 and entry["failures"] == 0
        assert entry["symbolic"] and all(entry["symbolic"].values())
    assert "concentration" in report["not_checked"]


def test_a_false_inequality_or_identity_is_reported(monkeypatch, capsys):
    label, _, _, checked = theory.CHECKS["theorem1"]
    monkeypatch.setitem(theory.CHECKS, "theorem1", (
        label, lambda: {"a false identity": False}, lambda rng: rng.random() < 0.5, checked))
    broken = theory.check_all(instances=300, seed=1)[0]
    assert not broken.ok and broken.instances == 100 and 30 < broken.failures < 70
    with pytest.raises(SystemExit) as exit_:
        main(["theory", "check", "--instances", "30"])
    assert exit_.value.code == 1 and "FAILED" in capsys.readouterr().out


def test_the_light_tail_instances_would_catch_a_wrong_constant():
    rng = random.Random(0)
    # sigma_w sqrt(3 log m) is not a lower bound of the certificate's optimised form
    misses = 0
    for _ in range(2000):
        ell, sw, lam = (Fraction(rng.randint(1, 100), rng.randint(1, 100)) for _ in range(3))
        misses += (ell / lam + lam * sw**2 / 2)**2 < 3 * ell * sw**2
    assert misses > 0
