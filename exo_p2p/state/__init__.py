"""Pure rules over the replicated State: apply, hashing, the chain digest, derived views
(the topology and cycle search placement uses live in ``master/placement/``)."""

from exo_p2p.state.apply import EventOrderError, apply
from exo_p2p.state.hashing import canonical_bytes, state_hash
from exo_p2p.state.views import InstanceView, instance_view, instances_of_model

__all__ = ["EventOrderError", "apply", "canonical_bytes", "state_hash", "InstanceView", "instance_view", "instances_of_model"]
