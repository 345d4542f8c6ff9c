"""Runner states (docs/architecture.md#rules): Idle → Connecting → Connected → Loading → Loaded →
WarmingUp → Ready ⇄ Running → ShuttingDown → Shutdown; Failed from anywhere. A runner whose
node lacks the model is Downloading before Idle (its shard's chunks come from peers: docs/models.md)."""

from __future__ import annotations

import msgspec


class _Status(msgspec.Struct, frozen=True, tag=True, tag_field="kind"):
    pass


class RunnerDownloading(_Status, tag="downloading"):
    """The node fetches this rank's shard from peers: ``bytes_done`` of ``bytes_total``
    (stored bytes of the shard's chunks, those already on disk counted as done) at
    ``bytes_per_second`` (received since the fetch began ÷ its seconds); of the bytes received,
    ``bytes_from_peers`` came from other nodes and ``bytes_from_hub`` from a model hub
    (docs/models.md#models-from-a-hub); no runner process exists yet (``worker.worker``)."""

    bytes_done: int
    bytes_total: int
    bytes_per_second: float = 0.0
    bytes_from_peers: int = 0
    bytes_from_hub: int = 0


class RunnerIdle(_Status, tag="idle"):
    pass


class RunnerConnecting(_Status, tag="connecting"):
    pass


class RunnerConnected(_Status, tag="connected"):
    pass


class RunnerLoading(_Status, tag="loading"):
    """``layers_loaded`` of ``layers_total`` (this rank's layers) are in memory."""

    layers_loaded: int
    layers_total: int


class RunnerLoaded(_Status, tag="loaded"):
    """``peak_memory_bytes`` is ``mx.get_peak_memory()`` measured during the load."""

    peak_memory_bytes: int = 0


class RunnerWarmingUp(_Status, tag="warming_up"):
    pass


class RunnerReady(_Status, tag="ready"):
    pass


class RunnerRunning(_Status, tag="running"):
    pass


class RunnerShuttingDown(_Status, tag="shutting_down"):
    pass


class RunnerShutdown(_Status, tag="shutdown"):
    pass


class RunnerFailed(_Status, tag="failed"):
    error: str


RunnerStatus = (
    RunnerDownloading
    | RunnerIdle
    | RunnerConnecting
    | RunnerConnected
    | RunnerLoading
    | RunnerLoaded
    | RunnerWarmingUp
    | RunnerReady
    | RunnerRunning
    | RunnerShuttingDown
    | RunnerShutdown
    | RunnerFailed
)

SERVING_STATUSES = (RunnerReady, RunnerRunning)
TERMINAL_STATUSES = (RunnerShutdown, RunnerFailed)
