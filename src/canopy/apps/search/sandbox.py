"""Run untrusted Python (generated programs and their tests) in a contained subprocess.

Layers, outermost first (what holds when the one inside it is bypassed):

1. **Namespaces** (Linux, when ``unshare`` works here: as root, or with unprivileged user
   namespaces): a fresh network namespace with no interfaces but a down loopback, so nothing
   can be reached, not even 127.0.0.1; a PID namespace, so every process the program starts
   dies with it. Without them (:func:`isolation` says which), network is blocked only by
   layer 3.
2. **Limits** (``setrlimit``): CPU seconds, address space (``memory_mb``), size of any file it
   writes (its output files included: over ``max_output`` it is killed), open files, no core
   dumps, and at most :data:`MAX_PROCESSES` processes of its user. Run as root, the program
   drops to user ``nobody`` first (root ignores the process limit, and ``nobody`` cannot
   write outside its private directory), with a Python whose standard library ``nobody`` can
   read (:func:`interpreter`; the system's when this one lives under a private home). A
   wall-clock ``timeout_s`` kills the whole process group.
3. **An audit hook** (PEP 578) installed before the program runs: it refuses socket
   connections and binds, starting programs (``subprocess``, ``os.system``, ``exec*``,
   ``posix_spawn``), and opening files for writing outside the program's directory. Python
   code can get around an audit hook (``ctypes``); layers 1 and 2 do not depend on it.

The program runs in a private temporary directory (removed afterwards) with an environment of
its own: ``PATH``, ``HOME`` and ``TMPDIR`` pointing at that directory, ``LANG``; nothing of the
caller's environment, so no key leaks into it.
"""

from __future__ import annotations

import functools
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from canopy.validation import check_number

__all__ = ["MAX_PROCESSES", "SandboxResult", "interpreter", "isolation", "run_python"]

MAX_PROCESSES = 32
NOBODY = 65534

_BOOTSTRAP = r'''
import os, resource, sys
if os.geteuid() == 0 and __DROP__:
    os.setgroups([]); os.setgid(__NOBODY__); os.setuid(__NOBODY__)
resource.setrlimit(resource.RLIMIT_NPROC, (__NPROC__, __NPROC__))
_home = os.path.realpath(os.getcwd())
_STARTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn"}
_NET = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}
def _inside(path):
    try:
        return os.path.realpath(os.fsdecode(path)).startswith(_home + os.sep)
    except (TypeError, ValueError):
        return False
def _guard(event, args):
    if event in _NET or event in _STARTS:
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and len(args) > 1 and isinstance(args[0], (str, bytes)):
        mode, flags = args[1], args[2] if len(args) > 2 else 0
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
            (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        if writing and not _inside(args[0]):
            raise PermissionError(f"sandbox: writing {args[0]!r} outside the sandbox")
sys.addaudithook(_guard)
sys.argv = ["main.py"]
_source = open("main.py", encoding="utf-8").read()
exec(compile(_source, "main.py", "exec"), {"__name__": "__main__"})
'''


@dataclass(frozen=True)
class SandboxResult:
    """``returncode`` (``None`` when killed for the wall clock), the captured output (each at
    most ``max_output`` bytes, decoded), and why it was stopped, if it was."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    reason: str | None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.reason is None


@functools.lru_cache(maxsize=1)
def isolation() -> tuple[str, ...]:
    """The ``unshare`` prefix that gives a fresh network and PID namespace here, or ``()``
    when none works (then the network is blocked only by the audit hook)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    base = (unshare, "--net", "--pid", "--fork", "--kill-child")
    for prefix in (base, (*base, "--user", "--map-root-user")):
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    return ()


@functools.lru_cache(maxsize=1)
def interpreter() -> tuple[str, bool]:
    """The Python that runs programs, and whether it runs them as ``nobody``: as root, the
    first of this Python and the system's whose standard library ``nobody`` can read (this
    Python may live under a private home); otherwise this Python as the current user."""
    if os.geteuid() != 0:
        return sys.executable, False
    probe = (f"import os; os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY}); "
             "import email.parser, decimal, json, unittest")
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if not candidate:
            continue
        try:
            done = subprocess.run([candidate, "-I", "-c", probe], capture_output=True,
                                  timeout=30, cwd="/")
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return candidate, True
    return sys.executable, False


def _limits(cpu_s: int, memory_bytes: int, file_bytes: int) -> None:
    """In the child, before exec: its own process group and the resource limits."""
    os.setsid()
    for limit, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_bytes),
                         (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_NOFILE, 64),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))


def _read(path: Path, limit: int) -> str:
    with open(path, "rb") as handle:
        return handle.read(limit).decode("utf-8", errors="replace")


def _reason(returncode: int | None, stderr: str, timed_out: bool) -> str | None:
    if timed_out:
        return "wall-clock limit"
    signals = {-signal.SIGXCPU: "CPU limit", -signal.SIGXFSZ: "output limit",
               -signal.SIGKILL: "killed (CPU or memory limit)"}
    if returncode in signals:
        return signals[returncode]
    if "MemoryError" in stderr:
        return "memory limit"
    if "sandbox:" in stderr and "PermissionError" in stderr:
        return "forbidden operation"
    return None


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie awaiting its reaper does not)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] not in "ZX":
                return True
    return False


def _kill_group(pgid: int, grace_s: float = 10.0) -> None:
    """SIGKILL the whole process group and wait until none of it runs: a killed process
    takes a moment to exit, and the caller is promised that nothing is left behind."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if not Path("/proc/self/stat").exists() or not _group_alive(pgid) \
                or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def run_python(source: str, *, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 512,
               max_output: int = 65536) -> SandboxResult:
    """Run ``source`` as ``main.py`` in a fresh sandbox (see the module docstring)."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a string, got {type(source).__name__}")
    timeout_s = check_number(timeout_s, "timeout_s", low=0.01)
    memory_mb = int(check_number(memory_mb, "memory_mb", low=16))
    max_output = int(check_number(max_output, "max_output", low=1))
    home = Path(tempfile.mkdtemp(prefix="canopy-sandbox-"))
    work = home / "work"
    work.mkdir()
    try:
        (work / "main.py").write_text(source, encoding="utf-8")
        python, drop = interpreter()
        (home / "boot.py").write_text(_BOOTSTRAP.replace("__NOBODY__", str(NOBODY))
                                      .replace("__NPROC__", str(MAX_PROCESSES))
                                      .replace("__DROP__", str(drop)), encoding="utf-8")
        if drop:  # the program runs as nobody: its directory is its own
            os.chown(work, NOBODY, NOBODY)
            os.chown(work / "main.py", NOBODY, NOBODY)
            os.chmod(home, 0o711)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work),
               "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        out_path, err_path = home / "stdout", home / "stderr"
        file_bytes = max(max_output, 1 << 20)
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            process = subprocess.Popen(
                [*isolation(), python, "-I", "-B", str(home / "boot.py")],
                cwd=work, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                preexec_fn=functools.partial(_limits, math.ceil(timeout_s) + 1,
                                             memory_mb << 20, file_bytes))
            timed_out = False
            try:
                process.communicate(stdin.encode("utf-8"), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            except BrokenPipeError:  # it exited without reading its input
                pass
            _kill_group(process.pid)  # what it left running in the background dies with it
            process.wait()
        stdout, stderr = _read(out_path, max_output), _read(err_path, max_output)
        code = None if timed_out else process.returncode
        return SandboxResult(code, stdout, stderr, timed_out, _reason(code, stderr, timed_out))
    finally:
        shutil.rmtree(home, ignore_errors=True)
