"""The explored tree's kernels compile from an empty numba cache.

They are compiled without numba's reference counting, so every compiled function they call
must allocate nothing. Whether a callee allocates only shows when numba types it for the
first time from such a caller: with a warm on-disk cache the callee's earlier compilation is
reused and a kernel that cannot compile passes. A fresh process with an empty cache is what
a new install (and CI) runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    from canopy.instances import infinite_depth, tree_lipschitz
    from canopy.policies.descent import MemoryBoundedDescent, OptimisticDescent
    from canopy.policies.hoo import HOO, POO
    from canopy.run import run

    problem = tree_lipschitz(3, 3, seed=0)
    for options in (dict(spread="assumed"), dict(spread="estimated"), dict(spread="hybrid"),
                    dict(spread="certified", certificate="paper"),
                    dict(spread="certified", certificate="sharp"),
                    dict(expand="always"), dict(expand="fixed", max_depth=2),
                    dict(split="variance")):
        run(OptimisticDescent(**options), problem, budget=300, seed=0)
    for options in (dict(), dict(split="eq6"), dict(spread="certified")):
        run(MemoryBoundedDescent(max_nodes=10, **options), infinite_depth(),
            budget=300, seed=0)
    for policy in (HOO(), POO()):
        run(policy, problem, budget=300, seed=0)
    print("compiled")
""")


def test_every_explored_tree_kernel_compiles_from_an_empty_numba_cache(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("compiled")
