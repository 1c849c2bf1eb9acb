"""Deprecated: region sources moved to :mod:`canopy.regional.sources`; this module keeps
their old names importable, with a warning, for one release."""

from canopy._lazy import deprecated_aliases

deprecated_aliases(__name__, {"RegionSource": "canopy.regional.sources",
                              "load_classifier": "canopy.regional.sources"})
