"""The registry of studies: name -> module defining ``STUDY`` (a
:class:`~canopy.experiments.study.Study`).

To add a study, write ``canopy/experiments/studies/<name>.py`` with a module-level
``STUDY = Study(name=<name>, module=__name__, ...)`` and add one line below. ``realtopk``
(top-k over real model pools) lives on the top-k branch; it is listed here already and shows
up in ``canopy list`` once its module is present.
"""

from __future__ import annotations

import importlib
import importlib.util

from canopy.experiments.study import Study

__all__ = ["ON_REQUEST", "STUDIES", "available", "get_study"]

#: The registered studies: name -> the module that defines its ``STUDY``.
STUDIES: dict[str, str] = {
    "fidelity": "canopy.experiments.studies.fidelity",
    "memory": "canopy.experiments.studies.memory",
    "violations": "canopy.experiments.studies.violations",
    "compression": "canopy.experiments.studies.compression",
    "ablation": "canopy.experiments.studies.ablation",
    "theorylink": "canopy.experiments.studies.theorylink",
    "realtopk": "canopy.experiments.studies.realtopk",
    "certificate": "canopy.experiments.studies.certwidth",
    "pyxab": "canopy.experiments.studies.pyxab",
    "discontinuities": "canopy.experiments.studies.discontinuities",
    "lowerbound": "canopy.experiments.studies.lowerbound",
    "misidentification": "canopy.experiments.studies.misidentification",
    "variancesplit": "canopy.experiments.studies.variancesplit",
    "mathsearch": "canopy.experiments.studies.mathsearch",
    "mmlutrim": "canopy.experiments.studies.mmlutrim",
}

ON_REQUEST: tuple[str, ...] = ("pyxab", "mathsearch", "mmlutrim")
"""Studies ``canopy reproduce`` runs only when named with ``--study``: the comparison with
PyXAB's algorithms takes hours at T = 100k (their per-round cost grows with the rounds);
``mathsearch`` and ``mmlutrim`` need a live model server."""


def available() -> list[str]:
    """Registered studies whose module is present in this build, in registry order."""
    return [name for name, module in STUDIES.items()
            if importlib.util.find_spec(module) is not None]


def get_study(name: str) -> Study:
    """The study registered as ``name``; unknown or absent names raise a ``ValueError``."""
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; known: {', '.join(available())}")
    module = STUDIES[name]
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"study {name!r} is registered but its module {module} is not in "
                         "this build")
    study = importlib.import_module(module).STUDY
    if not isinstance(study, Study) or study.name != name:
        raise TypeError(f"{module}.STUDY must be a Study named {name!r}")
    return study
