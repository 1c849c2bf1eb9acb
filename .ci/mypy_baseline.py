"""The type check as a ratchet: run mypy over the package (``[tool.mypy]`` in pyproject.toml)
and compare its errors with ``.ci/mypy-baseline.txt``. An error is known by its code and
message, not its file and line, so moving or editing code does not disturb the baseline.
It fails when an error is new (or more frequent than the baseline says), and when the baseline
lists errors that are gone: then ``python .ci/mypy_baseline.py --update`` shrinks it.

Usage: ``python .ci/mypy_baseline.py [--update]`` from the repository root."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

BASELINE = Path(__file__).with_name("mypy-baseline.txt")
ERROR = re.compile(r"^(?P<where>[^:\s]+\.py):\d+: error: (?P<message>.*?)\s+\[(?P<code>[\w-]+)\]$")


def errors() -> tuple[Counter[str], dict[str, str]]:
    """mypy's errors as ``Counter("[code] message")``, and a place of each for the report."""
    run = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--no-pretty",
                          "--hide-error-context", "--show-error-codes"],
                         capture_output=True, text=True, check=False)
    if run.returncode not in (0, 1) or "error:" in run.stderr:
        sys.exit(f"mypy did not run: {run.stderr.strip()[-2000:]}")
    found: Counter[str] = Counter()
    where: dict[str, str] = {}
    for line in run.stdout.splitlines():
        if match := ERROR.match(line):
            key = f"[{match['code']}] {match['message']}"
            found[key] += 1
            where.setdefault(key, line.split(": error:")[0])
    return found, where


def main() -> int:
    found, where = errors()
    if "--update" in sys.argv[1:]:
        BASELINE.write_text("".join(f"{n} {key}\n" for key, n in sorted(found.items())))
        print(f"{BASELINE}: {sum(found.values())} errors")
        return 0
    known: Counter[str] = Counter()
    for line in BASELINE.read_text().splitlines():
        count, key = line.split(" ", 1)
        known[key] = int(count)
    new, gone = found - known, known - found
    for key, n in sorted(new.items()):
        print(f"new: {where[key]}: {key} (x{n})")
    for key, n in sorted(gone.items()):
        print(f"fixed, still in the baseline: {key} (x{n})")
    print(f"mypy: {sum(found.values())} errors, baseline {sum(known.values())}")
    if gone and not new:
        print("the baseline only shrinks: run python .ci/mypy_baseline.py --update")
    return 1 if new or gone else 0


if __name__ == "__main__":
    sys.exit(main())
