"""The sandbox holds for an ordinary user, not only for root: whatever a generated program
uses (``open``, ``ctypes`` ``open``/``system``/``execv``, ``subprocess``, ``os.system``), it
reads no 0600 file of the user who runs it, starts no shell and writes nothing outside its
folder. Run as root, the test drops to ``nobody`` (``setpriv``) around the whole caller, so
the sandbox itself starts as an ordinary user; a second test runs the same programs as root."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from canopy.apps.search import sandbox
from canopy.apps.search.sandbox import SandboxUnavailable, isolation, run_python
from helpers import missing

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox is Linux's", allow_module_level=True)

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- canopy-test-secret"
NOBODY = 65534


def _programs(secret: Path, outside: Path) -> dict[str, str]:
    """Each tries to read ``secret``, run a shell (which would print SHELL-RAN and write a
    file) and write into ``outside`` (world-writable: only the sandbox stops it)."""
    shell = f"echo SHELL-RAN; echo x > {outside}/by-shell".encode()
    return {
        "open": f"print(open({str(secret)!r}).read())",
        "open-write": f"open({str(outside / 'by-open')!r}, 'w').write('x')",
        "ctypes-open": (
            "import ctypes, os\nlibc = ctypes.CDLL(None)\n"
            f"fd = libc.open({str(secret).encode()!r}, os.O_RDONLY)\n"
            "buf = ctypes.create_string_buffer(4096)\nn = libc.read(fd, buf, 4096)\n"
            "print(fd, buf.raw[:max(n, 0)].decode(errors='replace'))\n"
            f"w = libc.open({str(outside / 'by-ctypes').encode()!r}, "
            "os.O_WRONLY | os.O_CREAT, 0o644)\nprint('write fd', w)\n"
            "print(libc.write(w, b'x', 1))"),
        "ctypes-system": (f"import ctypes\nprint(ctypes.CDLL(None).system({shell!r}))"),
        "ctypes-execv": (
            "import ctypes\nlibc = ctypes.CDLL(None)\n"
            "for sh in (b'/bin/sh', b'/usr/bin/sh', b'/bin/bash', b'/usr/bin/dash'):\n"
            "    argv = (ctypes.c_char_p * 4)(sh, b'-c', " + repr(shell) + ", None)\n"
            "    print(sh, libc.execv(sh, argv))"),
        "subprocess": (f"import subprocess\nprint(subprocess.run(['/bin/sh', '-c', {shell!r}]))"),
        "os-system": f"import os\nprint(os.system({shell.decode()!r}))",
        "posix-spawn": (
            "import os\nprint(os.posix_spawn('/bin/sh', ['sh', '-c', "
            f"{shell.decode()!r}], {{}}))"),
    }


_CALLER = """
import json, sys
from canopy.apps.search.sandbox import isolation, run_python
programs = json.loads(sys.argv[1])
out = {"isolation": isolation()}
for name, source in programs.items():
    result = run_python(source, timeout_s=20)
    out[name] = [result.stdout, result.stderr, result.returncode]
print(json.dumps(out))
"""


def _check(results: dict, outside: Path) -> None:
    for name, value in results.items():
        if name == "isolation":
            continue
        stdout, stderr, _ = value
        assert SECRET not in stdout and SECRET not in stderr, name
        assert "SHELL-RAN" not in stdout, (name, stdout)
    assert sorted(os.listdir(outside)) == [], "something was written outside the sandbox"


def _blocked_for_others(path: Path) -> Path | None:
    """The topmost ancestor of ``path`` that others cannot enter, if any."""
    for parent in reversed(path.parents):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return parent
    return None


def _as_nobody(argv: list[str]) -> list[str]:
    """``argv`` run as ``nobody`` with this Python and this checkout visible to it: folders
    others cannot enter (a private home holding the interpreter, say) are hidden behind an
    empty tmpfs in a mount namespace of the test, and only the needed paths bound back."""
    needed = [Path(sys.base_prefix), *(Path(p) for p in sys.path if p and Path(p).is_dir())]
    hidden: dict[Path, None] = {}
    for path in needed:
        blocked = _blocked_for_others(path.resolve())
        if blocked is not None:
            hidden[blocked] = None
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    if not hidden:
        return drop
    mounts = [arg for top in hidden for arg in ("--tmpfs", str(top))]
    for path in needed:
        real = path.resolve()
        for top in hidden:
            if top in real.parents:  # bwrap would make the folders between private (0700)
                between = [p for p in reversed(real.parents) if top in p.parents]
                mounts += [arg for p in between for arg in ("--perms", "0755", "--dir", str(p))]
                mounts += ["--ro-bind", str(real), str(real)]
    return ["bwrap", "--dev-bind", "/", "/", *mounts, "--die-with-parent", *drop]


@pytest.fixture
def ordinary_files():
    """A 0600 secret owned by the user who will run the sandbox, and a world-writable folder
    outside it; both outside pytest's private tmp_path so that the user can reach them."""
    root = Path(tempfile.mkdtemp(prefix="canopy-sandbox-test-"))
    os.chmod(root, 0o755)
    home, outside = root / "home", root / "outside"
    home.mkdir()
    outside.mkdir()
    os.chmod(outside, 0o777)
    secret = home / "id_rsa"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    os.chmod(home, 0o700)
    if os.geteuid() == 0:
        for path in (home, secret):
            os.chown(path, NOBODY, NOBODY)
    yield secret, outside
    shutil.rmtree(root, ignore_errors=True)


def test_an_ordinary_user_s_sandbox_holds(ordinary_files):
    secret, outside = ordinary_files
    if shutil.which("bwrap") is None:
        missing("bubblewrap is not installed (apt-get install -y bubblewrap)")
    argv = [sys.executable, "-c", _CALLER, json.dumps(_programs(secret, outside))]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is needed to drop to nobody")
        argv = _as_nobody(argv)
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "PATH": "/usr/bin:/bin",
           "LANG": "C.UTF-8", "HOME": str(secret.parent)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env,
                          cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["isolation"] == "bwrap"
    _check(results, outside)
    # the same programs run by that user outside the sandbox do read the secret: the test can
    # tell containment from a broken program
    assert SECRET in subprocess.run(
        (_as_nobody(["cat", str(secret)]) if os.geteuid() == 0 else ["cat", str(secret)]),
        capture_output=True, text=True, timeout=60).stdout


@pytest.mark.parametrize("mode", ["bwrap", "root"])
def test_root_s_sandbox_holds(ordinary_files, mode):
    if os.geteuid() != 0:
        pytest.skip("root only")
    if mode == "bwrap" and not sandbox.bubblewrap():
        missing("bubblewrap does not work here")
    secret, outside = ordinary_files
    os.chown(secret, 0, 0)  # root's own 0600 file
    os.chown(secret.parent, 0, 0)
    results = {name: (r.stdout, r.stderr, r.returncode) for name, source in
               _programs(secret, outside).items()
               for r in [run_python(source, timeout_s=20, isolation_mode=mode)]}
    if mode == "bwrap":
        _check(results, outside)
        return
    # the fallback without bubblewrap: as nobody the program reads nothing of root's and its
    # Python-level writes outside are refused, but through ctypes nobody can start a shell and
    # write where anyone may (here a 0777 folder): bubblewrap is what stops that
    assert all(SECRET not in out + err for out, err, _ in results.values())
    assert not (outside / "by-open").exists()


def test_without_isolation_untrusted_code_is_refused_unless_the_caller_opts_out(monkeypatch):
    monkeypatch.setattr(sandbox, "bubblewrap", lambda: ())
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxUnavailable, match=r"bubblewrap.*CANOPY_SANDBOX=none"):
        run_python("print(1)")
    with pytest.raises(SandboxUnavailable, match="'bwrap' does not work here"):
        isolation("bwrap")
    monkeypatch.setenv("CANOPY_SANDBOX", "none")
    assert isolation() == "none"
    assert run_python("print(6 * 7)").stdout.strip() == "42"
    with pytest.raises(ValueError, match="unknown sandbox isolation 'jail'"):
        isolation("jail")
