"""What a runner uses for the settings its instance's ranks must share.

Ranks that prefill in chunks of different sizes reach their collectives (the pipeline's
hidden-state hand-offs, the task agreement between prefill chunks) at different points and
deadlock; the supervisor then kills them as silent. So the placing master fixes these
settings in the instance (``Instance.settings``, ``RankSettings``) and every runner of the
instance uses the instance's values, whatever its own node was started with. Only an instance
that carries none (placed by a master that did not fix them) falls back to the node's own.
"""

from __future__ import annotations

from exo_p2p.types import Instance, RankSettings


def runner_rank_settings(instance: Instance, node_settings: RankSettings) -> RankSettings:
    """The settings a runner of ``instance`` uses: the instance's, else ``node_settings``
    (this node's ``--prefill-chunk-size``)."""
    return instance.settings if instance.settings is not None else node_settings
