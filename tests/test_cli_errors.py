"""Every ``canopy`` command meets a user error (bad option, missing file, missing data, missing
extra) with one line on stderr and exit code 2, through the real entry point ``main``."""

from __future__ import annotations

import sys

import pytest
from typer.main import get_command

from canopy.cli import app, main, user_error
from canopy.errors import EngineError
from canopy.llm.local import MissingEngine


def _leaf_commands() -> list[list[str]]:
    found: list[list[str]] = []

    def walk(command, path):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
        else:
            found.append(path)

    walk(get_command(app), [])
    return found


def _fails_politely(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "cells/s" not in line]
    assert exit_.value.code == 2, (argv, err)
    assert "Traceback" not in err and len(lines) == 1, (argv, err)
    assert lines[0].startswith(("error", "Error")), (argv, err)
    return lines[0]


@pytest.fixture(autouse=True)
def _no_data_and_wide_lines(monkeypatch, tmp_path):
    monkeypatch.setenv("CANOPY_DATA_DIR", str(tmp_path / "no-mirror"))
    monkeypatch.setenv("CANOPY_CACHE_DIR", str(tmp_path / "no-cache"))
    monkeypatch.delenv("CANOPY_DOWNLOAD", raising=False)
    monkeypatch.setenv("COLUMNS", "1000")  # one message is one line, not wrapped by rich


COMMANDS = _leaf_commands()


def test_the_walk_covers_every_command():
    assert len(COMMANDS) >= 12
    assert ["demo"] in COMMANDS and ["serve", "router"] in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_a_bad_option_is_one_line(path, capsys):
    line = _fails_politely([*path, "--no-such-option"], capsys)
    assert "--no-such-option" in line and "--help" in line


MISSING_FILE = {
    "topk": ["topk", "--pool", "missing.csv", "--target", "x", "--budget", "5"],
    "route replay": ["route", "replay", "--dataset", "missing.jsonl"],
    "serve router": ["serve", "router", "--config", "missing.json"],
    "cache replay": ["cache", "replay", "--trace", "missing.jsonl"],
    "search prior": ["search", "prior", "--from-log", "missing.jsonl"],
}


@pytest.mark.parametrize("argv", MISSING_FILE.values(), ids=MISSING_FILE.keys())
def test_a_missing_file_is_one_line(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "missing" in _fails_politely(argv, capsys)


MISSING_DATA = {
    "route replay": ["route", "replay", "--dataset", "routellm-mmlu"],
    "cache replay": ["cache", "replay", "--trace", "conversation", "--capacity", "16"],
    "search replay": ["search", "replay"],
    "run realtopk": ["run", "realtopk", "--quick", "--workers", "1"],
    "search run": ["search", "run", "--n", "1"],
    "trim run": ["trim", "run", "--n", "1"],
    "search code": ["search", "code", "--dataset", "mbpp", "--n", "1"],
    "search prior": ["search", "prior", "--dataset", "humaneval", "--n", "1"],
}


@pytest.mark.parametrize("argv", MISSING_DATA.values(), ids=MISSING_DATA.keys())
def test_missing_data_is_one_line_naming_the_fix(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _fails_politely(argv, capsys)
    assert "not found" in line and "CANOPY_DATA_DIR" in line


MISSING_EXTRA = {
    "serve router": (["serve", "router", "--config", "c.json"], "uvicorn", "serve"),
    "run --backend ray": (["run", "fidelity", "--quick", "--backend", "ray"], "ray", "ray"),
    "theory check": (["theory", "check", "--instances", "3"], "sympy", "theory"),
}


@pytest.mark.parametrize("argv,module,extra", MISSING_EXTRA.values(), ids=MISSING_EXTRA.keys())
def test_a_missing_extra_names_the_pip_command(argv, module, extra, capsys, tmp_path,
                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.json").write_text("{}")
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    line = _fails_politely(argv, capsys)
    assert f"pip install 'canopy-bandits[{extra}]'" in line


def test_debug_shows_the_traceback():
    with pytest.raises(FileNotFoundError):
        main(["route", "replay", "--dataset", "routellm-mmlu", "--debug"])


def test_an_engine_that_dies_at_start_is_one_line_with_its_last_word(capsys, tmp_path,
                                                                      monkeypatch):
    """``vllm serve`` exiting before it answers (here an interpreter that prints an error and
    exits) is one line: what happened and the engine's last line, not a traceback."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'starting'\necho 'ValueError: no room for the KV cache' "
                      ">&2\nexit 3\n")
    python.chmod(0o755)
    monkeypatch.setenv("CANOPY_VLLM_PYTHON", str(python))
    monkeypatch.setenv("CANOPY_VLLM_MODEL_DIR", str(tmp_path / "models"))
    line = _fails_politely(["cache", "live", "--engine", "vllm", "--policies", "lru",
                            "--requests", "4", "--repeats", "1"], capsys)
    assert "exited with code 3" in line and "no room for the KV cache" in line


def test_a_missing_extra_is_known_by_its_type_not_its_text():
    """The command line prints a :class:`MissingExtra` (the local engine's missing package
    among them) as its message, and takes any other ImportError for a bug, whatever it says."""
    missing = MissingEngine("llama-cpp-python is not installed (pip install 'x')")
    assert isinstance(missing, EngineError) and user_error(missing) == str(missing)
    assert user_error(ImportError("cannot import name 'x' (pip install y)")) is None
