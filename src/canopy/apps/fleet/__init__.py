"""The fleet simulator: Mooncake-format traces replayed through N simulated replicas under
the replica policies of :mod:`canopy.fleet`, and its command ``canopy fleet sim``."""
