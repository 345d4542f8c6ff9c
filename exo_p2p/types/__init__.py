"""All wire and state types of exo-p2p: msgspec Structs, no I/O (docs/architecture.md#layers)."""

from exo_p2p.types.chunks import Chunk, EmbeddingChunk, ErrorChunk, FinishChunk, FinishReason, PrefillProgressChunk, TokenChunk
from exo_p2p.types.commands import (
    CancelGeneration,
    Command,
    CommandEnvelope,
    CommandResult,
    DeleteInstance,
    FinishGeneration,
    PlaceInstance,
    SubmitTask,
)
from exo_p2p.types.common import (
    PROTOCOL_VERSION,
    Bytes,
    CommandId,
    ErrorInfo,
    InstanceId,
    ModelId,
    NodeId,
    RunnerId,
    TaskId,
    new_id,
)
from exo_p2p.types.events import (
    Event,
    HubModelResolved,
    HubModelsForgotten,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    InstanceFailed,
    InstanceUsed,
    InstancePrefixesUpdated,
    LinkLost,
    LinkMeasured,
    LocalEvent,
    MasterElected,
    NodeModelsUpdated,
    NodeProfileUpdated,
    NodeTimedOut,
    RunnerDeleted,
    RunnerStatusUpdated,
    TaskCancelRequested,
    TaskCreated,
    TaskDeleted,
    TaskStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgesCreated,
    TopologyEdgeDeleted,
)
from exo_p2p.types.instances import Instance, InstanceStatus, InstanceUsage, PlacedNode, RankSettings, ShardMetadata, Sharding
from exo_p2p.types.models import HubSource, ModelCard
from exo_p2p.types.runner import (
    SERVING_STATUSES,
    TERMINAL_STATUSES,
    RunnerConnected,
    RunnerConnecting,
    RunnerFailed,
    RunnerIdle,
    RunnerLoaded,
    RunnerLoading,
    RunnerDownloading,
    RunnerReady,
    RunnerRunning,
    RunnerShutdown,
    RunnerShuttingDown,
    RunnerStatus,
    RunnerWarmingUp,
)
from exo_p2p.types.state import RunnerRecord, State
from exo_p2p.types.tasks import (
    FINISHED_TASK_STATUSES,
    CancelTask,
    ChatMessage,
    ImageRef,
    TASK_KINDS,
    WORK_TASKS,
    ConnectToGroup,
    CreateRunner,
    Embedding,
    EmbeddingParams,
    GenerationParams,
    LoadModel,
    OutputFormat,
    Rerank,
    RerankParams,
    Shutdown,
    StartWarmup,
    Task,
    TaskRecord,
    TaskKind,
    TaskStatus,
    TextGeneration,
    ToolCall,
    WorkTask,
)
from exo_p2p.types.chunks import ImageChunk, ImageProgressChunk
from exo_p2p.types.images import ImageParams
from exo_p2p.types.tasks import ImageEdits, ImageGeneration
from exo_p2p.types.topology import InterfaceType, LinkFigures, NetworkAddress, NodeProfile, NodeSpeed, TopologyEdge

__all__ = [name for name in dir() if not name.startswith("_")]
