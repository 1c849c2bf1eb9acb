"""Many replicas of one model: the replica index (which replica holds which block), load per
replica, and the replica policies (the production routers' rules by name, and Canopy's, which
learns the cache-versus-load trade-off per region of the prefix tree). Hosts: the fleet
simulator (:mod:`canopy.apps.fleet`) and a live gateway."""

from typing import TYPE_CHECKING

from canopy._lazy import lazy_exports

if TYPE_CHECKING:  # the lazy exports as the type checker sees them (re-exported)
    from canopy.fleet.index import ReplicaIndex as ReplicaIndex
    from canopy.fleet.load import Load as Load
    from canopy.fleet.policies import NAMES as NAMES
    from canopy.fleet.policies import PEERS as PEERS
    from canopy.fleet.policies import ReplicaPolicy as ReplicaPolicy
    from canopy.fleet.policies import Request as Request
    from canopy.fleet.policies import View as View
    from canopy.fleet.policies import make_policy as make_policy

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
