"""Reading a user's files without trusting them.

Every reader of a user-supplied file (pools, routing logs, traces, prior logs, calibration
files) goes through here, so each hostile input fails the same way: a :class:`BadInput`
(a ``ValueError``) whose one-line message names the file, and the line where there is one.

- :func:`open_checked` opens without blocking and looks at what it opened before reading:
  only a regular file of at most ``max_bytes`` is read (a FIFO, a device such as
  ``/dev/zero``, a directory, a symlink loop or a file above the cap is refused);
- :func:`lines` streams it in bounded memory: one line at a time, at most ``max_line_bytes``
  each, decoded as UTF-8 with the line named on failure;
- :func:`parse_json` refuses nesting deeper than ``max_depth`` before the parser recurses;
- :func:`read_bytes` and :func:`read_text` read a small file whole (gzip decompressed under
  the same cap).

Caps are per reader; ``CANOPY_MAX_INPUT_MB`` raises (or lowers) every file-size cap at once.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import re
import stat
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import numpy as np

__all__ = ["BadInput", "MiB", "jsonl", "lines", "open_checked", "parse_json", "read_bytes",
           "read_text"]

MiB = 2**20
ENV_CAP = "CANOPY_MAX_INPUT_MB"
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISSOCK, "a socket"))
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


class BadInput(ValueError):
    """A user file that cannot be read as asked: ``file[:line]: why``, one line."""

    def __init__(self, file: str | os.PathLike[str], why: str, line: int | None = None):
        where = f"{os.fspath(file)}:{line}" if line is not None else os.fspath(file)
        super().__init__(f"{where}: {why}")


def _cap(max_bytes: int) -> int:
    text = os.environ.get(ENV_CAP, "").strip()
    if not text:
        return max_bytes
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{ENV_CAP} must be a number of MiB, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"{ENV_CAP} must be > 0, got {text!r}")
    return int(value * MiB)


def _size(n: int) -> str:
    return f"{n / MiB:,.0f} MiB" if n >= MiB else f"{n:,} bytes"


@contextmanager
def open_checked(file: str | os.PathLike[str], *, max_bytes: int,
                 what: str = "file") -> Iterator[IO[bytes]]:
    """The file opened for binary reading once it is known to be a regular file of at most
    ``max_bytes`` (the cap, or ``CANOPY_MAX_INPUT_MB``). Opening never blocks (a FIFO with no
    writer is refused, not waited on); reads past the cap fail even if the file grows."""
    cap = _cap(max_bytes)
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        why = "a symlink loop" if error.errno == errno.ELOOP else error.strerror or str(error)
        raise BadInput(file, f"cannot open {what}: {why}") from None
    try:
        info = os.fstat(fd)
        for test, kind in _KINDS:
            if test(info.st_mode):
                raise BadInput(file, f"{what} is {kind}, not a regular file")
        if not stat.S_ISREG(info.st_mode):
            raise BadInput(file, f"{what} is not a regular file")
        if info.st_size > cap:
            raise BadInput(file, f"{what} is {_size(info.st_size)}, above the {_size(cap)} "
                                 f"limit (set {ENV_CAP} to raise it)")
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield _Capped(handle, cap, file, what)  # type: ignore[misc]


class _Capped:
    """A binary reader that refuses to read past ``cap`` bytes in all."""

    def __init__(self, handle: IO[bytes], cap: int, file: str | os.PathLike[str], what: str):
        self._handle, self._left, self._file, self._what = handle, cap, file, what
        self._cap = cap

    def _take(self, data: bytes) -> bytes:
        self._left -= len(data)
        if self._left < 0:
            raise BadInput(self._file, f"{self._what} grew past the {_size(self._cap)} limit "
                                       "while being read")
        return data

    def read(self, n: int = -1) -> bytes:
        return self._take(self._handle.read(self._left + 1 if n < 0 else min(n, self._left + 1)))

    def readline(self, limit: int) -> bytes:
        return self._take(self._handle.readline(min(limit, self._left + 1)))


def read_bytes(file: str | os.PathLike[str], *, max_bytes: int, what: str = "file") -> bytes:
    """The whole file (a ``.gz`` file decompressed, under the same cap)."""
    with open_checked(file, max_bytes=max_bytes, what=what) as handle:
        raw = handle.read()
    if not os.fspath(file).endswith(".gz"):
        return raw
    cap = _cap(max_bytes)
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as unpacked:
            out = unpacked.read(cap + 1)
    except (OSError, EOFError, zlib.error) as error:
        raise BadInput(file, f"not a readable gzip file ({error})") from None
    if len(out) > cap:
        raise BadInput(file, f"{what} unpacks to more than {_size(cap)} (set {ENV_CAP} to "
                             "raise the limit)")
    return out


def read_text(file: str | os.PathLike[str], *, max_bytes: int, what: str = "file") -> str:
    """The whole file as UTF-8 text (a byte-order mark dropped; ``.gz`` unpacked), the line
    of the first byte that is not UTF-8 named on failure."""
    raw = read_bytes(file, max_bytes=max_bytes, what=what)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise BadInput(file, f"not UTF-8 text (byte 0x{raw[error.start]:02x})", line) from None


def lines(file: str | os.PathLike[str], *, max_bytes: int, max_line_bytes: int = 8 * MiB,
          what: str = "file") -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for each line (newline kept), streamed: memory stays within
    one line of ``max_line_bytes``. A UTF-8 byte-order mark on the first line is dropped."""
    with open_checked(file, max_bytes=max_bytes, what=what) as handle:
        number = 0
        while raw := handle.readline(max_line_bytes + 1):
            number += 1
            if len(raw) > max_line_bytes:
                raise BadInput(file, f"line longer than {_size(max_line_bytes)}", number)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise BadInput(file, f"not UTF-8 text (byte 0x{raw[error.start]:02x} at "
                                     f"column {error.start + 1})", number) from None
            yield number, text.removeprefix("\ufeff") if number == 1 else text


def parse_json(text: str, *, file: str | os.PathLike[str], line: int | None = None,
               max_depth: int = 32) -> Any:
    """``json.loads(text)``, refusing nesting deeper than ``max_depth`` before parsing."""
    data = text.encode("utf-8", "surrogatepass")
    if data.count(b"[") + data.count(b"{") > max_depth:
        codes = np.frombuffer(_STRING.sub(b"", data), dtype=np.uint8)
        step = ((codes == ord("[")) | (codes == ord("{"))).astype(np.int64) - (
            (codes == ord("]")) | (codes == ord("}")))
        if step.size and int(np.cumsum(step).max()) > max_depth:
            raise BadInput(file, f"JSON nested deeper than {max_depth} levels", line)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise BadInput(file, f"not valid JSON ({error.msg})", line) from None
    except RecursionError:  # a max_depth above what the parser's recursion allows
        raise BadInput(file, "JSON nested too deeply", line) from None


def jsonl(file: str | os.PathLike[str], *, max_bytes: int, max_line_bytes: int = 8 * MiB,
          max_depth: int = 32, objects: bool = True,
          what: str = "file") -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of a JSON-lines file, streamed; with
    ``objects`` every value must be a JSON object."""
    for number, text in lines(file, max_bytes=max_bytes, max_line_bytes=max_line_bytes,
                              what=what):
        if not text.strip():
            continue
        value = parse_json(text, file=file, line=number, max_depth=max_depth)
        if objects and not isinstance(value, dict):
            raise BadInput(file, "expected a JSON object", number)
        yield number, value
