"""Hostile files through every reader of a user's file: each is refused with one line that
names the file, exit code 2, no traceback, in bounded memory (peak RSS of the command under
3 GB, read from its own resource usage) and bounded time (a per-test timeout; no wall-clock
figure is asserted)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from canopy import safeio
from canopy.apps.cache.traces import resolve
from canopy.apps.routing.logs import read_long
from canopy.apps.search.prior import read_log

pytestmark = pytest.mark.timeout(240)

READERS = {
    "topk": ("topk", "--target", "a", "--budget", "10", "--pool"),
    "router-config": ("serve", "router", "--config"),
    "route": ("route", "replay", "--seeds", "1", "--dataset"),
    "cache": ("cache", "replay", "--capacity", "4", "--policies", "lru", "--trace"),
    "prior": ("search", "prior", "--from-log"),
}
RSS_LIMIT_KB = 3 * 2**20  # 3 GiB
KILL_AFTER_S = 180  # a bound so that a hang fails the test instead of stalling the suite


_CHILD = """
import contextlib, io, json, resource, sys
from canopy.cli import main
out = []
for args in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(args)
            code = 0
        except SystemExit as done:
            code = done.code
    out.append([code, err.getvalue()])
print(json.dumps({"runs": out, "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def _canopy_runs(runs: list[list[str]], cwd: Path) -> tuple[list[tuple[int, str]], int]:
    """Exit code and stderr of each ``canopy ARGS`` run, in one child process of its own, and
    that child's peak RSS (KiB): the largest any of the runs reached."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "200"}
    env.pop(safeio.ENV_CAP, None)
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(runs)], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=KILL_AFTER_S)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return [tuple(run) for run in report["runs"]], report["rss_kb"]


def _canopy(*args: str, cwd: Path) -> tuple[int, str, int]:
    """Exit code, stderr and peak RSS (KiB) of one ``canopy ARGS`` run in a child."""
    [(code, stderr)], rss_kb = _canopy_runs([list(args)], cwd)
    return code, stderr, rss_kb


def _fifo(folder: Path) -> Path:
    os.mkfifo(folder / "in.jsonl")
    return folder / "in.jsonl"


def _dev_zero(folder: Path) -> Path:
    (folder / "in.jsonl").symlink_to("/dev/zero")
    return folder / "in.jsonl"


def _sparse(folder: Path) -> Path:
    file = folder / "in.jsonl"
    with open(file, "wb") as handle:
        handle.truncate(2 * 2**30)
    return file


def _loop(folder: Path) -> Path:
    (folder / "in.jsonl").symlink_to("in.jsonl")
    return folder / "in.jsonl"


def _directory(folder: Path) -> Path:
    (folder / "in.jsonl").mkdir()
    return folder / "in.jsonl"


def _missing(folder: Path) -> Path:
    return folder / "in.jsonl"


def _write(text: bytes) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        (folder / "in.jsonl").write_bytes(text)
        return folder / "in.jsonl"
    return make


def _long_line(folder: Path) -> Path:
    file = folder / "in.jsonl"
    row = {"timestamp": 0, "input_length": 1, "hash_ids": list(range(2_000_000))}
    file.write_text(json.dumps(row) + "\n")
    return file


HOSTILE = {
    "fifo": _fifo,
    "dev-zero": _dev_zero,
    "sparse-2gb": _sparse,
    "symlink-loop": _loop,
    "directory": _directory,
    "missing": _missing,
    "empty": _write(b""),
    "non-utf8": _write(b'{"tree": "t\xff\xfe"}\n'),
    "deep-json": _write(b"[" * 100_000 + b"]" * 100_000 + b"\n"),
    "deep-object": _write(b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"\n"),
    "nul-bytes": _write(b"\x00" * 4096),
    "two-million-ids": _long_line,
}


@pytest.mark.parametrize("reader", READERS)
def test_every_hostile_file_is_one_line_and_exit_2(tmp_path, reader):
    files = {}
    for case, make in HOSTILE.items():
        (tmp_path / case).mkdir()
        files[case] = make(tmp_path / case)
    runs, rss_kb = _canopy_runs([[*READERS[reader], str(files[case])] for case in HOSTILE],
                                tmp_path)
    for case, (code, stderr) in zip(HOSTILE, runs, strict=True):
        assert code == 2, (case, stderr)
        assert stderr.strip() and stderr.strip().count("\n") == 0, (case, stderr)
        assert "Traceback" not in stderr, case
        assert f"{case}/in.jsonl" in stderr, (case, stderr)  # names the file
    assert rss_kb < RSS_LIMIT_KB


@pytest.mark.parametrize(("reader", "text", "why"), [
    ("cache", b'{"timestamp": 0, "input_length": 9, "hash_ids": [1, -2]}\n', "integers >= 0"),
    ("cache", b'{"timestamp": 0, "input_length": 9, "hash_ids": [1.5, 2]}\n', "integers >= 0"),
    ("cache", b"[1, 2, -3]\n", "integers >= 0"),
    ("prior", b'{"tree": "q", "node": 0, "parent": null, "depth": 0, "probe": 0.5, '
              b'"truth": 1}\n{"tree": "q", "node": 1, "parent": 2, "depth": 1, "probe": 0.5, '
              b'"truth": 1}\n{"tree": "q", "node": 2, "parent": 1, "depth": 1, "probe": 0.5, '
              b'"truth": 1}\n', "cycle"),
    ("prior", b'{"tree": "q", "node": 1.5, "parent": null, "depth": 0, "probe": 0.5, '
              b'"truth": 1}\n', "node must be an int"),
    ("prior", b'{"tree": "q", "node": 3, "parent": 9, "depth": 1, "probe": 0.5, '
              b'"truth": 1}\n', "not logged"),
])
def test_a_malformed_structure_is_refused_with_its_line(tmp_path, reader, text, why):
    file = _write(text)(tmp_path)
    with pytest.raises(ValueError) as refused:
        (read_log if reader == "prior" else resolve)(file)
    assert f"{file}:" in str(refused.value) and why in str(refused.value)


def test_a_parent_cycle_is_refused_by_the_library(tmp_path):
    rows = [{"tree": "q", "node": n, "parent": p, "depth": d, "probe": 0.5, "truth": 1.0}
            for n, p, d in [(0, None, 0), (1, 2, 1), (2, 1, 1)]]
    file = tmp_path / "log.jsonl"
    file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match=r"log\.jsonl:\d: node \d of tree 'q' is at depth 1 "
                                         r"under parent \d at depth 1"):
        read_log(file)
    rows[1]["parent"], rows[2]["parent"], rows[2]["depth"] = 0, 1, 2
    file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert [row.parent for row in read_log(file)] == [None, 0, 1]


def test_a_query_id_of_zero_is_an_id(tmp_path):
    file = tmp_path / "log.jsonl"
    rows = [{"query_id": q, "region": "r", "model": m, "quality": 0.5, "cost": 0.1}
            for q in (0, 1) for m in ("a", "b")]
    file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert read_long(file).query_ids == ("0", "1")


def test_a_gzip_bomb_pool_is_refused_at_the_cap(tmp_path):
    file = tmp_path / "in.jsonl.gz"
    file.write_bytes(gzip.compress(b"name,a\n" + b"m,0.5\n" * (6 * 2**20)))  # 36 MiB unpacked
    code, stderr, rss_kb = _canopy(*READERS["topk"], str(file), cwd=tmp_path)
    assert code == 2 and "unpacks to more than 32 MiB" in stderr, stderr
    assert rss_kb < RSS_LIMIT_KB


def test_a_cache_larger_than_the_machine_is_refused(tmp_path):
    code, stderr, _ = _canopy("cache", "live", "--capacity-mb", "1e12", cwd=tmp_path)
    assert code == 2 and "at most this machine's memory" in stderr, stderr


def test_the_size_cap_can_be_raised_and_lowered(tmp_path, monkeypatch):
    file = _write(b'{"a": 1}\n' * 1000)(tmp_path)
    monkeypatch.setenv(safeio.ENV_CAP, "0.001")
    with pytest.raises(safeio.BadInput, match=r"in\.jsonl: file is 9,000 bytes, above the "
                                              r"1,048 bytes limit"):
        list(safeio.jsonl(file, max_bytes=safeio.MiB))
    monkeypatch.setenv(safeio.ENV_CAP, "1")
    assert len(list(safeio.jsonl(file, max_bytes=10))) == 1000
