"""The sandbox for generated code: each way a program can misbehave is
stopped or contained, and a well-behaved program runs normally."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox's limits are Linux's", allow_module_level=True)

from canopy.apps.search.sandbox import (
    MAX_PROCESSES,
    SandboxUnavailable,
    isolation,
    namespaces,
    run_python,
)

try:
    isolation()
except SandboxUnavailable as missing:  # neither bubblewrap nor root: nothing to test here
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        raise
    pytest.skip(str(missing), allow_module_level=True)


def test_a_well_behaved_program_runs_with_its_input():
    result = run_python("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))",
                        stdin="1 2 3")
    assert result.ok and result.stdout.strip() == "6"


def test_an_infinite_loop_is_stopped_by_the_wall_clock():
    t0 = time.monotonic()
    result = run_python("while True:\n    pass", timeout_s=1.0)
    assert result.timed_out and result.returncode is None
    assert result.reason == "wall-clock limit"
    assert time.monotonic() - t0 < 10


def test_unbounded_allocation_hits_the_memory_limit():
    result = run_python("x = []\nwhile True:\n    x.append(bytearray(10**7))", memory_mb=128,
                        timeout_s=10)
    assert not result.ok and result.reason in ("memory limit", "killed (CPU or memory limit)")


def _live_sandboxed_processes() -> int:
    """Processes of a sandboxed program that still run, whatever the isolation (its command
    line names the sandbox's ``boot.py``; zombies awaiting their reaper do not count)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            count += b"boot.py" in command and "State:\tZ" not in status
    return count


def test_a_fork_bomb_is_contained_and_leaves_nothing_behind():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = run_python(bomb, timeout_s=2.0)
    assert not result.ok and result.timed_out
    assert _live_sandboxed_processes() == 0  # the process limit held and every one is gone
    assert MAX_PROCESSES <= 64


def test_a_background_process_dies_with_the_program():
    daemon = ("import os, time\nif os.fork() == 0:\n    time.sleep(60)\n"
              "else:\n    print('parent done')")
    result = run_python(daemon, timeout_s=5.0)
    assert result.ok and result.stdout.strip() == "parent done"
    assert _live_sandboxed_processes() == 0


def test_writing_outside_its_directory_is_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    os.chmod(tmp_path, 0o777)  # even a world-writable place outside is refused
    result = run_python(f"open({str(target)!r}, 'w').write('x')\n"
                        "open('inside.txt', 'w').write('fine')")
    assert not target.exists()
    assert not result.ok and result.reason == "forbidden operation"
    inside = run_python("open('inside.txt', 'w').write('fine')\nprint(open('inside.txt').read())")
    assert inside.ok and inside.stdout.strip() == "fine"


def test_no_secret_of_the_caller_reaches_the_program(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-caller-secret")
    result = run_python("import os\nprint(sorted(os.environ))\n"
                        "print(os.environ.get('OPENAI_API_KEY'))")
    assert result.ok and "sk-caller-secret" not in result.stdout
    assert "OPENAI_API_KEY" not in result.stdout


def test_the_network_is_out_of_reach():
    """A listener on this machine's loopback: the program cannot connect to it (a fresh
    network namespace when available, and the audit hook in any case)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    accepted: list[object] = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    program = ("import socket\ns = socket.socket()\ns.settimeout(2)\n"
               f"s.connect(('127.0.0.1', {port}))\nprint('connected')")
    result = run_python(program, timeout_s=5)
    server.close()
    assert "connected" not in result.stdout and not accepted
    assert not result.ok


def test_starting_programs_is_refused():
    result = run_python("import subprocess\nprint(subprocess.run(['echo', 'hi']))")
    assert not result.ok and result.reason == "forbidden operation"


def test_output_is_capped():
    result = run_python("import sys\nsys.stdout.write('x' * 10_000_000)", max_output=1000,
                        timeout_s=10)
    assert len(result.stdout) <= 1000 and not result.ok


def test_namespaces_are_used_when_the_machine_allows_them():
    if not namespaces():
        pytest.skip("unshare gives no network namespace on this machine")
    done = subprocess.run([*namespaces(), sys.executable, "-c",
                           "import socket; print(socket.if_nameindex())"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "eth" not in done.stdout


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="timeout_s"):
        run_python("pass", timeout_s=0)
    with pytest.raises(TypeError, match="source"):
        run_python(b"pass")  # type: ignore[arg-type]
