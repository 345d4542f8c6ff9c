"""Node settings and their defaults (docs/architecture.md#defaults). Every default is configurable."""

from __future__ import annotations

import os
import re
from pathlib import Path

import msgspec

from exo_p2p import defaults
from exo_p2p.types.engine import EngineSettings

DEFAULT_API_HOST = "127.0.0.1"
DEFAULT_API_PORT = 52515
DEFAULT_LISTEN_PORT = 52514
NO_PEERS_WARNING_AFTER = 10.0
"""Seconds without any peer before a node warns "no peers found" (docs/architecture.md#defaults)."""
PEER_TIMEOUT = defaults.PEER_TIMEOUT
"""Seconds without a heartbeat after which a peer is considered gone (``exo_p2p.defaults``)."""
RUNNER_SILENT_GENERATING = 10.0
"""Seconds a ready runner may send nothing at all (not even the heartbeat its own thread sends
every second: a stopped or frozen process) before its supervisor kills it (``worker.liveness``)."""
CPU_WEIGHTS = ("auto", "float32", "stored")
"""``--cpu-weights``: what a CPU-only node's runners hold (``master.placement.split.rank_weights``)."""
RUNNER_SILENT_LOADING = 60.0
"""Seconds a runner may send nothing at all while loading or warming up before it is killed."""
RUNNER_STEP_FLOOR = 45.0
"""Seconds one engine step or agreement round may always last before its runner counts as
stuck (the bound is the larger of this and ``RUNNER_STEP_FACTOR`` × the longest recent step;
``worker.liveness``). A rank wedged in a collective (a dropped ring link) is killed after it."""
RUNNER_STEP_FACTOR = 5.0
"""How many times its longest recent step (warm-up included) one step may last (``worker.liveness``)."""
RUNNER_UNIT_BOUND = 60.0
"""Seconds a runner may go without a layer loaded (loading), a warm-up step ended (warming up)
or a message handled before it counts as stuck (``worker.liveness``)."""
RUNNER_OUTPUT_DRAIN = 2.0
"""Seconds a supervisor keeps relaying a runner's fd 1/2 output after the runner exited (its
last lines; ``worker.runner_output``), in JSON log mode."""


def default_data_dir() -> Path:
    """``$EXO_P2P_HOME``, else ``$XDG_DATA_HOME/exo-p2p``, else ``~/.local/share/exo-p2p``
    (docs/architecture.md#defaults; ``--data-dir`` wins over all of these)."""
    env = os.environ.get("EXO_P2P_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "exo-p2p"


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def parse_bytes(text: str) -> int:
    """Parse a size such as ``"1073741824"``, ``"512MiB"``, ``"16GiB"``, ``"1.5GB"`` into bytes.

    Units: B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024), case-insensitive.
    Raises ``ValueError`` naming the text for anything else, for negative values, and for 0.
    """
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"invalid size {text!r}: use bytes or a unit, e.g. 512MiB, 16GiB")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ValueError(f"invalid size {text!r}: must be greater than 0")
    return value


class NodeConfig(msgspec.Struct):
    """Everything ``exo-p2p node`` is started with.

    Sizes in bytes, durations in seconds. ``memory_limit`` caps the memory the node offers
    (docs/architecture.md#rules). ``models_dirs`` are extra directories of models. ``queue_limit`` caps
    in-flight chat requests on this node's API (429 beyond it). ``engine`` holds the runners'
    engine settings as one record (``EngineSettings``: tokens, sequences, bytes; defaults in
    ``exo_p2p.defaults``). ``compact_every`` is the number of events in the log at which it is
    compacted into a snapshot of State (``exo_p2p.replica``). ``cpu_weights`` (one of ``CPU_WEIGHTS``)
    is published in the node profile. ``log_file``: the log goes there (appended) instead of
    stderr. ``fault_hooks`` is for tests only (e.g. ``{"runner_stall": "loading"}``) and is
    passed to runners through their task, never read from the environment.
    """

    data_dir: Path
    api_host: str = DEFAULT_API_HOST
    api_port: int = DEFAULT_API_PORT
    listen_host: str = "0.0.0.0"
    listen_port: int = DEFAULT_LISTEN_PORT
    memory_limit: int | None = None
    models_dirs: list[Path] = msgspec.field(default_factory=list)
    log_format: str = "console"
    log_level: str = "info"
    log_file: Path | None = None
    cluster: str = "default"
    cluster_secret_file: Path | None = None
    bootstrap: list[str] = msgspec.field(default_factory=list)
    priority: int = 0
    new_identity: bool = False
    friendly_name: str | None = None
    queue_limit: int | None = 64
    max_moves: int = 2
    """Times a request may move to another instance after a failure (``exo_p2p.api.generation.resume``)."""
    engine: EngineSettings = msgspec.field(default_factory=lambda: EngineSettings(prompt_cache_bytes=defaults.NODE_PROMPT_CACHE_BYTES))
    """The runners' engine settings (``--prefill-chunk-size``, ``--max-batch``,
    ``--prompt-cache-bytes``, ``--kv-cache-bytes``; ``exo_p2p.types.engine``), handed to the
    worker as one record."""
    mdns: bool = True
    ollama: bool = True
    """List the models of an Ollama install (``--no-ollama``: not; ``exo_p2p.models.stores.ollama``)."""
    ollama_models: Path | None = None
    """Ollama's models dir (``--ollama-models``); None: ``$OLLAMA_MODELS``, else ``~/.ollama/models``."""
    lmstudio: bool = True
    """List the models of LM Studio's models dir (``--no-lmstudio``: not; ``exo_p2p.models.stores.lmstudio``)."""
    lmstudio_models: Path | None = None
    """LM Studio's models dir (``--lmstudio-models``); None: ``~/.lmstudio/models``, else
    ``~/.cache/lm-studio/models`` when only that one exists."""
    allow_image_urls: bool = False
    """Fetch http(s) image URLs in requests (``--allow-image-urls``; ``exo_p2p.vision.fetch``)."""
    allow_private_image_urls: bool = False
    """Also from private and loopback addresses (``--allow-private-image-urls``)."""
    offline: bool = False
    """Never ask a model hub (``--offline``; ``HF_HUB_OFFLINE=1`` does the same):
    models come only from this node's dirs and its peers (``exo_p2p.models.hub.fetch``)."""
    restore_size: bool = True
    """While master, bring shrunk instances back to their placed size (``master.restore``)."""
    relink: bool = True
    """While master, move idle instances onto much cheaper rings when links change (``master.relink``)."""
    compact_every: int = 20_000
    hub_card_idle: int = 600
    """While master, seconds a model read from a hub stays in State once nothing uses it
    (``--hub-card-idle``; ``master.hub_forget``, ``exo_p2p.state.hub_cards``)."""
    cpu_weights: str = "auto"
    calibrate: bool = True
    """Measure this node's speed and publish it (``worker.calibrate``; docs/placement-speed.md)."""
    fault_hooks: dict[str, str] = msgspec.field(default_factory=dict)
    api_keys: list[str] = msgspec.field(default_factory=list)
    """API keys a client must present (``--api-key``/``--api-key-file``); empty = none needed."""
    cors_origins: list[str] = msgspec.field(default_factory=list)
    """Web origins browsers may call the API from (``--cors-origins``; ``*`` = any)."""
    allowed_hosts: list[str] = msgspec.field(default_factory=list)
    """Host names the API answers besides IP addresses and ``localhost`` (``--allowed-hosts``;
    ``*`` = any; ``exo_p2p.api.hosts``)."""
    metrics: bool = True
    """Keep this node's Prometheus metrics (``--no-metrics``: ``GET /metrics`` answers 404 and
    finished requests are not counted; ``exo_p2p.metrics``)."""
    request_records: bool = True
    """Record every finished request (``--no-request-records``: no ``request.finished`` log
    line, no ``requests.jsonl``, ``GET /requests`` answers 404; ``exo_p2p.metrics.request_log``)."""
    metrics_loopback_open: bool = False
    """``GET /metrics`` needs no API key from a loopback client (``--metrics-loopback-open``)."""
    request_log_bytes: int = 16 * 1024 * 1024
    """Bytes of ``requests.jsonl`` in the data dir before it rotates; 0: no file
    (``--request-log-bytes``; ``exo_p2p.metrics.request_log``)."""
    log_request_text: bool = False
    """Request records carry the prompt and output text (``--log-request-text``)."""
    routing: str = "prefix"
    """While master, how requests are routed among ready instances: ``prefix`` or ``load``
    (``--routing``; ``master.routing``)."""
    place_on_demand: bool = True
    """A request for a model with no ready instance places one (``--no-place-on-demand``:
    409 as before; ``exo_p2p.api.demand.placer``)."""
    keep_alive: float = 300.0
    """Seconds an instance placed on demand stays loaded once idle, unless the request gives
    its own keep-alive; negative: forever (``--keep-alive``; ``master.idle``)."""
    aliases: list[str] = msgspec.field(default_factory=list)
    """Model aliases ``NAME=MODEL`` (``--alias``; NAME may be a glob such as ``claude-*``),
    published in this node's profile so every node's API resolves them
    (``exo_p2p.api.demand.aliases``)."""
    max_loaded_models: int | None = None
    """Models this node keeps loaded at most; a placement beyond it unloads this node's idle
    instances least recently used first, else is refused (``--max-loaded-models``;
    ``master.handover``). None: only memory bounds it."""
