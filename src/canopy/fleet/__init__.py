"""Many replicas of one model: the replica index (which replica holds which block), load per
replica, and the replica policies (the production routers' rules by name, and Canopy's, which
learns the cache-versus-load trade-off per region of the prefix tree). Hosts: the fleet
simulator (:mod:`canopy.apps.fleet`) and a live gateway."""

from canopy._lazy import lazy_exports

_EXPORTS = {
    "ReplicaIndex": "canopy.fleet.index",
    "Load": "canopy.fleet.load",
    "NAMES": "canopy.fleet.policies",
    "PEERS": "canopy.fleet.policies",
    "ReplicaPolicy": "canopy.fleet.policies",
    "Request": "canopy.fleet.policies",
    "View": "canopy.fleet.policies",
    "make_policy": "canopy.fleet.policies",
}

__all__ = sorted(_EXPORTS)

lazy_exports(__name__, _EXPORTS)
