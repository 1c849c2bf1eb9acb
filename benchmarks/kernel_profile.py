"""Replay a Mooncake trace under a policy many times, naming the compiled kernels for ``perf``.

numba's machine code has no symbols a profiler can read, so this compiles the replay's kernels
afresh (in a temporary cache directory: code loaded from numba's cache cannot be inspected)
and writes ``/tmp/perf-<pid>.map``, the map of addresses to names that ``perf report`` reads
for code generated at run time::

    perf record -e cpu-clock -F 20000 -o replay.data \\
        python benchmarks/kernel_profile.py --trace conversation --capacity 256 --rounds 150
    perf report -i replay.data --no-children --sort sym

Each kernel a replay calls once a request (``_lru_request``, ``_heap_request``,
``_sampled_request``, ``canopy``'s request loop ``_canopy_run`` with the cell update inlined)
is then a line of its own. The compilation (about a minute) is in the profile too; it is
the interpreter's and LLVM's symbols, apart from the kernels'.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile


def _readable(mangled: str) -> str:
    """``canopy.prefix.kernels._lru_request`` from numba's mangled
    ``_ZN6canopy6prefix7kernels12_lru_requestB3v11B40...``: the length-prefixed parts."""
    parts, i = [], 3
    while i < len(mangled) and mangled[i].isdigit():
        j = i
        while mangled[j].isdigit():
            j += 1
        i = j + int(mangled[i:j])
        parts.append(mangled[j:i])
    return ".".join(parts)


def _perf_map(dispatchers) -> int:
    """Write ``/tmp/perf-<pid>.map`` for every function compiled into ``dispatchers``'
    libraries (each sized up to the next one's start); returns how many it names."""
    named: dict[int, str] = {}
    for dispatcher in dispatchers:
        for overload in dispatcher.overloads.values():
            library = overload.library
            for name in re.findall(r"^(_ZN\w+):\s*$", library.get_asm_str(), re.M):
                address = library.get_pointer_to_function(name)
                if address:
                    named[address] = _readable(name)
    starts = sorted(named)
    with open(f"/tmp/perf-{os.getpid()}.map", "w") as out:
        for here, after in zip(starts, [*starts[1:], None], strict=True):
            size = after - here if after is not None and after - here < 1 << 20 else 4096
            out.write(f"{here:x} {size:x} {named[here]}\n")
    return len(starts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="conversation")
    parser.add_argument("--policy", default="canopy")
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=150)
    args = parser.parse_args()
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="canopy-profile-")

    from canopy import data
    from canopy.prefix import RadixCache, kernels, load_mooncake, make_policy
    from canopy.prefix.traces import TRACE_FILES

    trace = load_mooncake(data.path("mooncake", TRACE_FILES[args.trace]))
    RadixCache(trace, make_policy(args.policy), args.capacity).run()  # compile
    named = _perf_map([kernels.replay_canopy, kernels.replay, kernels.replay_keyed])
    print(f"named {named} compiled functions in /tmp/perf-{os.getpid()}.map", flush=True)
    for _ in range(args.rounds):
        RadixCache(trace, make_policy(args.policy), args.capacity).run()


if __name__ == "__main__":
    main()
