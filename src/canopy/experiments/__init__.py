"""Experiments: the paper's synthetic studies (Appendix D) on a command, locally or on Ray.

- :mod:`~canopy.experiments.study`: the :class:`Study` interface (cells, seeds, measurements);
- :mod:`~canopy.experiments.runner`: :func:`run_study`, the resumable fan-out over processes
  or a Ray cluster;
- :mod:`~canopy.experiments.summary`: means and 95% t-intervals;
- :mod:`~canopy.experiments.outputs`: ``results.json``, tables, figure, ``report.md``;
- :mod:`~canopy.experiments.studies`: the registry of studies.
"""

from canopy.experiments.runner import StudyRun, run_study
from canopy.experiments.studies import STUDIES, available, get_study
from canopy.experiments.study import Headline, Measurement, Panel, PaperValue, Row, Study
from canopy.experiments.summary import summarize, t_interval

__all__ = [
    "STUDIES",
    "Headline",
    "Measurement",
    "Panel",
    "PaperValue",
    "Row",
    "Study",
    "StudyRun",
    "available",
    "get_study",
    "run_study",
    "summarize",
    "t_interval",
]
