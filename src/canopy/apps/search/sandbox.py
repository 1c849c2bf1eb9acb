"""Run untrusted Python (generated programs and their tests) in a contained subprocess.

Isolation, chosen by ``isolation=`` (default ``"auto"``: the first that works here):

1. ``"bwrap"``: bubblewrap (Debian's ``bubblewrap``), which needs no privilege where user
   namespaces are allowed. The program sees a read-only minimal root: the Python interpreter,
   its standard library and the shared libraries they load (found with ``ldd``), nothing
   else: no shell or other program, no home, no ``/etc``, no ``/tmp`` of the host. It runs as
   ``nobody`` in fresh user, PID, network (no interfaces but a down loopback), IPC, UTS and
   cgroup namespaces, with every capability dropped, in a private tmpfs work folder
   ``/sandbox`` (at most ``max_output`` x 4 bytes, 1 MiB at least) that vanishes with it.
2. ``"root"`` (the fallback when bubblewrap is missing or cannot create namespaces, and this
   process is root): ``unshare`` network and PID namespaces where they work, and the program
   drops to user ``nobody`` in a private directory, with a Python whose standard library
   ``nobody`` can read (:func:`interpreter`). ``nobody`` can read only what is world-readable
   and write nowhere but its directory; a shell it starts runs as ``nobody`` too.
3. ``"none"``: no isolation, the program runs as the calling user. Never chosen by
   ``"auto"``: without bubblewrap and root, :func:`run_python` refuses with
   :class:`SandboxUnavailable` unless the caller opts out with ``isolation="none"`` (or
   ``CANOPY_SANDBOX=none``; the CLI's ``--allow-unisolated``).

Inside every one: resource limits (``setrlimit``: CPU seconds, address space ``memory_mb``,
size of any file written, open files, no core dumps, at most :data:`MAX_PROCESSES`
processes), a wall-clock ``timeout_s`` that kills the whole process tree, an environment of
its own (``PATH``, ``HOME``, ``TMPDIR`` at its folder, ``LANG``; nothing of the caller's, so no
key leaks into it), and an audit hook (PEP 578) that refuses sockets, starting programs and
writing outside its folder to Python code (``ctypes`` gets around an audit hook; the layers
above do not depend on it).
"""

from __future__ import annotations

import functools
import json
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

__all__ = ["ENV_ISOLATION", "ISOLATIONS", "MAX_PROCESSES", "SandboxResult", "SandboxUnavailable",
           "bubblewrap", "interpreter", "isolation", "namespaces", "run_python"]

#: The most processes a sandboxed program may hold at once.
MAX_PROCESSES = 32
NOBODY = 65534
ISOLATIONS = ("auto", "bwrap", "root", "none")
ENV_ISOLATION = "CANOPY_SANDBOX"
_WORK = "/sandbox"

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


class SandboxUnavailable(ValueError):
    """No isolation for untrusted code on this machine, and the caller did not opt out."""


@functools.lru_cache(maxsize=1)
def namespaces() -> tuple[str, ...]:
    """The ``unshare`` prefix that gives a fresh network and PID namespace here (the root
    fallback's), or ``()`` when none works."""
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


def _minimal_root(python: str) -> tuple[str, ...]:
    """bwrap arguments that mount, read-only, the interpreter, its standard library and
    every shared library it or its extension modules load (``ldd``), at their own paths."""
    where = subprocess.run(
        [python, "-I", "-S", "-c", "import sysconfig; p = sysconfig.get_paths()['stdlib']; "
         "print(p); print(sysconfig.get_config_var('DESTSHARED') or p)"],
        capture_output=True, text=True, timeout=30, check=True).stdout.split("\n")
    stdlib, dynload = where[0], where[1]
    objects = [python, *(str(p) for p in Path(dynload).glob("*.so"))]
    ldd = subprocess.run(["ldd", *objects], capture_output=True, text=True, timeout=60)
    libraries = set()
    for line in ldd.stdout.splitlines():
        parts = line.split("=>")[-1].split()
        if parts and parts[0].startswith("/") and len(parts) > 1 and parts[1].startswith("("):
            libraries.add(parts[0])
    if not libraries:
        raise ValueError(f"ldd found no libraries for {python}")
    args: list[str] = []
    for name in ("lib", "lib32", "lib64", "libx32"):
        if os.path.islink(f"/{name}"):
            args += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
    for path in sorted(libraries):
        args += ["--ro-bind", path, os.path.join(os.path.realpath(os.path.dirname(path)),
                                                 os.path.basename(path))]
    for path in dict.fromkeys((stdlib, dynload, python)):
        args += ["--ro-bind", path, path]
    return (*args, "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache")


def _drop_to_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


@functools.lru_cache(maxsize=1)
def bubblewrap() -> tuple[str, ...]:
    """The bwrap command (up to the work folder) that runs a Python in a minimal root as
    ``nobody`` in fresh namespaces, or ``()`` when bubblewrap is missing or cannot create
    them here. Run by root, bubblewrap itself starts as ``nobody`` (with the Python
    :func:`interpreter` finds readable by it): inside a user namespace owned by root the
    kernel would not count the program's processes against their limit."""
    bwrap = shutil.which("bwrap")
    if bwrap is None or not sys.platform.startswith("linux"):
        return ()
    python = os.path.realpath(interpreter()[0] if os.geteuid() == 0 else
                              getattr(sys, "_base_executable", sys.executable))
    try:
        root = _minimal_root(python)
        prefix = (bwrap, "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY),
                  "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                  "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                  "--cap-drop", "ALL", "--hostname", "sandbox", *root, "--proc", "/proc",
                  "--dev", "/dev", "--clearenv")
        done = subprocess.run([*prefix, "--tmpfs", _WORK, "--chdir", _WORK, python, "-I", "-S",
                               "-c", "import ctypes, decimal, json"], capture_output=True,
                              timeout=30, cwd="/",
                              preexec_fn=_drop_to_nobody if os.geteuid() == 0 else None)
    except (OSError, ValueError, subprocess.SubprocessError):
        return ()
    return (*prefix, python) if done.returncode == 0 else ()


def isolation(requested: str | None = None) -> str:
    """The isolation a run gets: ``requested`` (default ``$CANOPY_SANDBOX`` or ``"auto"``);
    ``"auto"`` is ``"bwrap"`` where bubblewrap works, else ``"root"`` when this process is
    root, else :class:`SandboxUnavailable`. Asking for one that does not work here raises it."""
    mode = requested or os.environ.get(ENV_ISOLATION, "").strip() or "auto"
    if mode not in ISOLATIONS:
        raise ValueError(f"unknown sandbox isolation {mode!r}; known: {', '.join(ISOLATIONS)}")
    if mode in ("auto", "bwrap") and bubblewrap():
        return "bwrap"
    if mode in ("auto", "root") and os.geteuid() == 0:
        return "root"
    if mode == "none":
        return mode
    why = ("no isolation for generated code here: bubblewrap (bwrap) is missing or cannot "
           "create user namespaces, and this is not root" if mode == "auto" else
           f"sandbox isolation {mode!r} does not work here")
    raise SandboxUnavailable(f"{why}; install bubblewrap (apt-get install bubblewrap), or opt "
                             f"out with {ENV_ISOLATION}=none (--allow-unisolated) to run it "
                             "as yourself")


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


def _limits(cpu_s: int, memory_bytes: int, file_bytes: int, drop: bool = False) -> None:
    """In the child, before exec: its own process group, the resource limits and, with
    ``drop``, user ``nobody``."""
    os.setsid()
    for limit, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_bytes),
                         (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_NOFILE, 64),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))
    if drop:
        _drop_to_nobody()


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


def _kill_namespace(info: Path, grace_s: float = 10.0) -> None:
    """SIGKILL the first process of a bwrap PID namespace (the kernel then kills every
    process in it) and wait until it is gone, so that nothing of the program outlives it."""
    try:
        pid = int(json.loads(info.read_text() or "{}").get("child-pid", 0))
    except (OSError, ValueError, AttributeError):
        return
    if pid <= 1:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, signal.SIGKILL)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (ProcessLookupError, FileNotFoundError, IndexError):
            return
        if state in "ZX":
            return
        time.sleep(0.01)


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


def _command(mode: str, home: Path, work: Path, max_output: int) -> tuple[list[str], str]:
    """The argv that runs ``boot.py`` under ``mode``, and the folder it starts in."""
    if mode == "bwrap":
        *bwrap, python = bubblewrap()
        size = max(4 * max_output, 1 << 20)
        env = [arg for key, value in _environment(_WORK).items()
               for arg in ("--setenv", key, value)]
        return [*bwrap, "--size", str(size), "--tmpfs", _WORK,
                "--ro-bind", str(home / "boot.py"), "/boot.py",
                "--ro-bind", str(work / "main.py"), f"{_WORK}/main.py",
                "--chdir", _WORK, *env, python, "-I", "-S", "-B", "/boot.py"], _WORK
    python, _ = interpreter() if mode == "root" else (sys.executable, False)
    prefix = namespaces() if mode == "root" else ()
    return [*prefix, python, "-I", "-B", str(home / "boot.py")], str(work)


def _environment(work: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}


def run_python(source: str, *, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 512,
               max_output: int = 65536, isolation_mode: str | None = None) -> SandboxResult:
    """Run ``source`` as ``main.py`` in a fresh sandbox (see the module docstring);
    ``isolation_mode`` as :func:`isolation` takes it."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a string, got {type(source).__name__}")
    timeout_s = check_number(timeout_s, "timeout_s", low=0.01)
    memory_mb = int(check_number(memory_mb, "memory_mb", low=16))
    max_output = int(check_number(max_output, "max_output", low=1))
    mode = isolation(isolation_mode)
    home = Path(tempfile.mkdtemp(prefix="canopy-sandbox-"))
    work = home / "work"
    work.mkdir()
    try:
        (work / "main.py").write_text(source, encoding="utf-8")
        drop = os.geteuid() == 0 and (mode == "bwrap" or interpreter()[1])
        (home / "boot.py").write_text(_BOOTSTRAP.replace("__NOBODY__", str(NOBODY))
                                      .replace("__NPROC__", str(MAX_PROCESSES))
                                      .replace("__DROP__", str(drop)), encoding="utf-8")
        if drop:  # the program runs as nobody: its directory is its own
            os.chown(work, NOBODY, NOBODY)
            os.chown(work / "main.py", NOBODY, NOBODY)
            os.chmod(home, 0o711)
        argv, cwd = _command(mode, home, work, max_output)
        out_path, err_path, info_path = home / "stdout", home / "stderr", home / "info"
        file_bytes = max(max_output, 1 << 20)
        with open(out_path, "wb") as out, open(err_path, "wb") as err, \
                open(info_path, "wb") as info:
            if mode == "bwrap":  # bwrap tells the host pid of its namespace's first process
                argv[1:1] = ["--info-fd", str(info.fileno())]
            process = subprocess.Popen(
                argv, cwd=work if mode != "bwrap" else home, env=_environment(cwd),
                stdin=subprocess.PIPE, stdout=out, stderr=err, pass_fds=(info.fileno(),),
                preexec_fn=functools.partial(_limits, math.ceil(timeout_s) + 1,
                                             memory_mb << 20, file_bytes,
                                             drop and mode == "bwrap"))
            timed_out = False
            try:
                process.communicate(stdin.encode("utf-8"), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            except BrokenPipeError:  # it exited without reading its input
                pass
            _kill_namespace(info_path)  # what it left running in the background dies with it
            _kill_group(process.pid)
            process.wait()
        stdout, stderr = _read(out_path, max_output), _read(err_path, max_output)
        code = None if timed_out else process.returncode
        return SandboxResult(code, stdout, stderr, timed_out, _reason(code, stderr, timed_out))
    finally:
        shutil.rmtree(home, ignore_errors=True)
