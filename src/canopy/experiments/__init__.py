"""Experiments: the paper's synthetic studies (Appendix D) on a command, locally or on Ray.

- :mod:`~canopy.experiments.study`: the :class:`Study` interface (cells, seeds, measurements);
- :mod:`~canopy.experiments.runner`: :func:`run_study`, the resumable fan-out over processes
  or a Ray cluster;
- :mod:`~canopy.experiments.summary`: means and 95% t-intervals;
- :mod:`~canopy.experiments.outputs`: ``results.json``, tables, figure, ``report.md``;
- :mod:`~canopy.experiments.studies`: the registry of studies.
"""

from canopy._lazy import lazy_exports

_EXPORTS = {
    "StudyRun": "runner", "load_study": "runner", "run_study": "runner",
    "STUDIES": "studies", "available": "studies", "get_study": "studies",
    "PROPORTION": "study", "UNBOUNDED": "study", "bounded": "study",
    "Headline": "study", "Measurement": "study", "Panel": "study", "PaperValue": "study",
    "Row": "study", "Study": "study",
    "summarize": "summary", "t_interval": "summary",
}


lazy_exports(__name__, {name: f"canopy.experiments.{module}"
                         for name, module in _EXPORTS.items()})


__all__ = [
    "PROPORTION",
    "STUDIES",
    "UNBOUNDED",
    "Headline",
    "Measurement",
    "Panel",
    "PaperValue",
    "Row",
    "Study",
    "StudyRun",
    "available",
    "bounded",
    "get_study",
    "load_study",
    "run_study",
    "summarize",
    "t_interval",
]
