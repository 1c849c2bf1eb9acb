"""Deprecated: the text embedding of region centroids moved to :mod:`canopy.regional.embed`;
this module keeps its old names importable, with a warning, for one release."""

from canopy._lazy import deprecated_aliases

deprecated_aliases(__name__, {"NearestCentroid": "canopy.regional.embed",
                              "embed": "canopy.regional.embed"})
