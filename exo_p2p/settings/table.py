"""The one table of ``exo-p2p node`` settings: one ``Setting`` (``exo_p2p.settings.setting``)
per flag of the ``node`` command, the whole declaration of the flag: its type or unit, bounds,
choices and check, the ``NodeConfig`` field it fills, its help text and help panel; its
environment variable and ``config.toml`` key derive from the flag. ``ENVIRONMENT`` lists the
other environment variables the code reads. Defaults are never written here: they are the
``NodeConfig`` fields' (``exo_p2p.config``).

Who reads it: the ``node`` command's options are generated from ``SETTINGS``
(``exo_p2p.cli.cluster.node_flags``); the values given are applied into ``NodeConfig`` by
``exo_p2p.settings.apply``; ``exo_p2p.settings.docs`` renders docs/configuration.md from it
(``scripts/gen_config_docs.py``); tests/test_configuration_docs.py checks the page, the
command's options and the defaults against this table. Adding a flag: docs/architecture.md
("How to add a node flag").
"""

from __future__ import annotations

from pathlib import Path

from exo_p2p.config import CPU_WEIGHTS, DEFAULT_API_HOST, DEFAULT_API_PORT
from exo_p2p.settings import checks
from exo_p2p.settings.setting import ALL_ONLY_MARK, EnvVar, Setting

BASICS, NET, ACCESS = "Basics", "Network and cluster", "API access"
SERVING, STORES = f"Serving {ALL_ONLY_MARK}", f"Model stores {ALL_ONLY_MARK}"
LOGS, RECOVERY = f"Logs, records and metrics {ALL_ONLY_MARK}", f"Recovery and identity {ALL_ONLY_MARK}"
PANELS = (BASICS, NET, ACCESS, SERVING, STORES, LOGS, RECOVERY)
"""The groups ``exo-p2p node --help`` shows the flags in (``Setting.panel``); those ending in
``ALL_ONLY_MARK`` only ``node --help-all`` shows, so that the first help fits a screen."""
LOG_FORMATS = ("console", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
ROUTINGS = ("prefix", "load")

_SETTINGS = (
    Setting("--api-port", "port", "HTTP API port", "api_port", "PORT",
            type=int, min=0, max=65535, bounds_in_help=False, panel=NET),
    Setting("--api-host", "address", "HTTP API bind address; 0.0.0.0 serves other machines", "api_host", "HOST", panel=NET),
    Setting("--listen-port", "port", "libp2p listen port; 0 picks a free one", "listen_port", "PORT",
            type=int, min=0, max=65535, bounds_in_help=False, panel=NET),
    Setting("--listen-host", "address", "libp2p listen address", "listen_host", "HOST", panel=NET),
    Setting("--data-dir", "path", "Identity, event log, models and config.toml", "data_dir", "DIR",
            when_unset="$XDG_DATA_HOME/exo-p2p, i.e. ~/.local/share/exo-p2p", env_name="EXO_P2P_HOME", key_name="",
            type=Path, panel=BASICS),
    Setting("--memory-limit", "size: bytes, or KiB/MiB/GiB (powers of 1024), KB/MB/GB (powers of 1000)",
            "Cap the memory this node offers: bytes or 512MiB, 16GiB (powers of 1024), 16GB (powers of 1000)",
            "memory_limit", "SIZE", when_unset="the machine's memory",
            check=checks.memory_limit_bytes, panel=BASICS),
    Setting("--models-dir", "path, repeatable", "A directory of models to serve: MLX-format model directories and "
            "GGUF files (repeatable; in the variable, separated by colons like PATH)", "models_dirs", "DIR", repeatable=True,
            type=Path, panel=BASICS),
    Setting("--ollama-models", "path", "Ollama's models dir (manifests/ and blobs/): its models are listed read-only "
            "as ollama:NAME:TAG", "ollama_models", "DIR", when_unset="$OLLAMA_MODELS, else ~/.ollama/models",
            type=Path, panel=STORES),
    Setting("--no-ollama", "flag", "Do not list the models of an Ollama install", "ollama", inverted=True,
            type=bool, panel=STORES),
    Setting("--lmstudio-models", "path", "LM Studio's models dir (PUBLISHER/MODEL dirs of MLX or GGUF files): its "
            "models are listed read-only as lmstudio:PUBLISHER/MODEL", "lmstudio_models", "DIR",
            when_unset="~/.lmstudio/models, else ~/.cache/lm-studio/models",
            type=Path, panel=STORES),
    Setting("--no-lmstudio", "flag", "Do not list the models of LM Studio's models dir", "lmstudio", inverted=True,
            type=bool, panel=STORES),
    Setting("--log-format", "console or json", "Log format; json: one JSON object per line, libraries and runners "
            "included", "log_format", "console|json",
            choices=LOG_FORMATS, panel=LOGS),
    Setting("--log-level", "debug, info, warning or error", "Log level: debug, info, warning or error", "log_level", "LEVEL",
            check=str.lower, choices=LOG_LEVELS, panel=BASICS),
    Setting("--log-file", "path", "Append the log to FILE", "log_file", "FILE", when_unset="stderr",
            type=Path, panel=BASICS),
    Setting("--cluster", "name", "Cluster name; nodes only join nodes of the same cluster", "cluster", "NAME",
            check=checks.cluster_name, panel=NET),
    Setting("--cluster-secret", "path", "File holding the cluster secret (see `exo-p2p cluster-secret`); a copy "
            "is kept in the data dir", "cluster_secret_file", "FILE",
            when_unset="the secret kept in the data dir, else none: an open cluster",
            type=Path, check=checks.secret_file, panel=NET),
    Setting("--bootstrap", "multiaddr, repeatable", "Address of a peer to dial (repeatable; in the variable, separated "
            "by spaces), e.g. /ip4/10.0.0.2/tcp/52514/p2p/NODE_ID (`exo-p2p nodes` prints them)", "bootstrap", "MULTIADDR", repeatable=True,
            check=checks.peer_addresses, panel=NET),
    Setting("--priority", "integer (32-bit)", "Election priority; higher wins a vacant master seat", "priority", "N",
            type=int, min=-(2**31), max=2**31 - 1, bounds_in_help=False, panel=RECOVERY),
    Setting("--new-identity", "flag", "Make a new node identity instead of the saved one (for a copied data dir)",
            "new_identity", type=bool,
            panel=RECOVERY),
    Setting("--name", "text", "Friendly name shown by `exo-p2p nodes` and in log lines", "friendly_name", "NAME",
            when_unset="the host name", panel=BASICS),
    Setting("--queue-limit", "count", "Chat requests in flight on this API before 429", "queue_limit", "N",
            type=int, min=1, panel=SERVING),
    Setting("--prefill-chunk-size", "tokens", "Prompt tokens per prefill step; the master fixes its value in "
            "each instance it places, for every rank", "engine.prefill_chunk_size", "TOKENS",
            type=int, min=1, panel=SERVING),
    Setting("--max-batch", "count", "Sequences a runner decodes together in one forward pass (1: one request "
            "at a time); a request joins only when its KV fits (--kv-cache-bytes); the master fixes its value in each "
            "instance it places, for every rank", "engine.max_batch", "N",
            type=int, min=1, panel=SERVING),
    Setting("--prompt-cache-bytes", "bytes", "KV of finished conversations a runner keeps (LRU) so a request "
            "extending one prefills only its new tokens (bounded in tokens: BYTES ÷ the KV bytes per token; at most a quarter "
            "of the runner's KV budget); 0 is off; a multi-rank instance keeps the smallest rank's bound, in tokens", "engine.prompt_cache_bytes", "BYTES",
            type=int, min=0, panel=SERVING),
    Setting("--disk-cache-bytes", "bytes", "KV of finished conversations each runner rank keeps on disk "
            "under <data dir>/prompt-cache (LRU, checksummed blocks of its own layers, written in the background), read back "
            "when a request extends one that RAM no longer holds, also after a restart; 0 is off; needs --prompt-cache-bytes",
            "engine.prompt_cache_disk_bytes", "BYTES",
            type=int, min=0, panel=SERVING),
    Setting("--kv-cache-bytes", "bytes", "KV cache a runner's batch may hold: a request joins the batch only "
            "when the KV it can grow to fits beside the others', else it waits; one that cannot fit alone gets a 503 "
            "out_of_memory", "engine.kv_cache_bytes", "BYTES",
            when_unset="what the node's memory leaves beside its placed shards",
            type=int, min=0, panel=SERVING),
    Setting("--kv-cache-bits", "0 | 8 | 4", "Bits of each KV cache element: 0 keeps full precision; 8 or 4 "
            "quantize the batch's, the prompt cache's and the disk tier's KV in groups of 64 (as mlx-lm), so "
            "--kv-cache-bytes holds ~1.9-3.6x (8) or ~3.6-6.4x (4) the tokens (float16-float32 KV); the master fixes its value in each "
            "instance it places, for every rank", "engine.kv_cache_bits", "0|8|4", type=int, check=checks.kv_cache_bits,
            panel=SERVING),
    Setting("--micro-batches", "count", "Micro-batches a pipeline rank splits its decode batch into, so "
            "its ranks compute at once (1: none; 0: as many as ranks when every rank has a host of its own, else none); "
            "the ranks of an instance use the smallest of theirs", "engine.micro_batches", "N",
            type=int, min=0, panel=SERVING),
    Setting("--speculative", "off | ngram", "Speculative decoding: ngram drafts each greedy row's next tokens "
            "from its own prompt and output and verifies them in the batch's forward pass (output unchanged; a row "
            "whose drafts are mostly rejected pauses drafting); off (the default until measured faster on a quiet "
            "machine, docs/benchmarks.md) decodes one token per step", "engine.speculative",
            "off|ngram", choices=("off", "ngram"), panel=SERVING),
    Setting("--num-draft", "tokens", "The most tokens a row drafts per step with --speculative ngram (1-16)",
            "engine.num_draft", "N", type=int, min=1, max=16, panel=SERVING),
    Setting("--cpu-weights", " | ".join(CPU_WEIGHTS), "On a CPU-only node, the weights runners hold: auto (float32 "
            "when the float32 share fits memory with 10% headroom, else as stored), float32, or stored (quantized as "
            "on disk); a Metal node always holds the stored weights", "cpu_weights", "|".join(CPU_WEIGHTS),
            choices=CPU_WEIGHTS, panel=SERVING),
    Setting("--no-calibrate", "flag", "Do not measure this node's speed (a ~1.5 s CPU calibration at start and "
            "every 10 minutes while idle); placement then splits layers in proportion to memory "
            "(docs/placement-speed.md)", "calibrate", inverted=True, type=bool, panel=SERVING),
    Setting("--max-moves", "count", "Times a request may move to another instance when its instance fails "
            "(0: never)", "max_moves", "N",
            type=int, min=0, panel=SERVING),
    Setting("--no-place-on-demand", "flag", "Answer a request for a model with no instance 409 (place it first) "
            "instead of placing it on demand (docs/models.md)", "place_on_demand", inverted=True,
            type=bool, panel=SERVING),
    Setting("--keep-alive", "duration: seconds, or 5m, 1h30m; negative: forever", "How long an instance placed "
            "on demand stays loaded once idle, unless the request gives its own (Ollama keep_alive); instances "
            "placed with `place` are kept until deleted unless it gives --keep-alive", "keep_alive", "DURATION",
            check=checks.keep_alive_seconds, panel=SERVING),
    Setting("--max-loaded-models", "count", "Models this node keeps loaded at most: placing another one unloads "
            "its idle instances least recently used first, else is refused", "max_loaded_models", "N",
            type=int, min=1, panel=SERVING),
    Setting("--alias", "NAME=MODEL, repeatable", "A model name clients may send for a model the cluster serves; "
            "NAME may be a glob such as claude-*; every node's API resolves it and lists it",
            "aliases", "NAME=MODEL", repeatable=True, check=checks.aliases, panel=SERVING),
    Setting("--no-mdns", "flag", "Do not discover peers on the LAN (use --bootstrap)", "mdns", inverted=True,
            type=bool, panel=NET),
    Setting("--offline", "flag", "Never fetch anything from a model hub (as HF_HUB_OFFLINE=1): models come only "
            "from this node's dirs and its peers", "offline",
            type=bool, panel=STORES),
    Setting("--no-restore-size", "flag", "While master, leave an instance re-placed on fewer nodes (shrunk) as it is "
            "instead of placing it at its size again once its nodes are back", "restore_size", inverted=True,
            type=bool, panel=RECOVERY),
    Setting("--no-relink", "flag", "While master, leave an idle instance on its ring when the links change "
            "instead of moving it to a much cheaper one (docs/links.md)", "relink", inverted=True,
            type=bool, panel=RECOVERY),
    Setting("--compact-every", "events", "Compact the event log into a snapshot of State once it holds this "
            "many events (or 16 MiB of events, whichever comes first)", "compact_every", "N",
            type=int, min=1, panel=RECOVERY),
    Setting("--hub-card-idle", "seconds", "While master, forget the card of a model read from a hub once no "
            "instance has used it and no node has held it for this long (State stays bounded; docs/security.md)",
            "hub_card_idle", "SECONDS",
            type=int, min=1, panel=STORES),
    Setting("--api-key", "text, repeatable", "API key clients must send as Authorization: Bearer KEY (repeatable; "
            "/health needs none)", "api_keys", "KEY", repeatable=True,
            check=checks.api_keys, panel=ACCESS),
    Setting("--api-key-file", "path", "File of API keys, one a line, # comments (with or instead of --api-key)",
            "api_keys", "FILE", type=Path, check=checks.api_key_file, keyword_name="api_key_file", panel=ACCESS),
    Setting("--cors-origins", "origins, repeatable", "Web origins browsers may call the API from, comma-separated "
            "or repeated; * = any", "cors_origins", "ORIGINS", repeatable=True,
            check=checks.cors_origins, panel=ACCESS),
    Setting("--allowed-hosts", "names, repeatable", "Host names the API answers to besides IP addresses and "
            "localhost (e.g. macbook.local), comma-separated or repeated; others get 403 (DNS-rebinding "
            "protection); * = any", "allowed_hosts", "NAMES", repeatable=True,
            check=checks.host_names, panel=ACCESS),
    Setting("--allow-image-urls", "flag", "Fetch http(s) image URLs that requests send (at most 10 MiB and 10 s "
            "each, no redirects, never private or loopback addresses; docs/security.md#image-urls); without it only "
            "images sent as data are read", "allow_image_urls",
            type=bool, panel=ACCESS),
    Setting("--allow-private-image-urls", "flag", "With --allow-image-urls, also fetch image URLs on private, "
            "loopback and link-local addresses (a LAN's own image server; lets API clients reach this node's network)",
            "allow_private_image_urls",
            type=bool, panel=ACCESS),
    Setting("--routing", "prefix | load", "While master, how a request picks among a model's ready instances: "
            "prefix (the one whose prompt cache holds the longest prefix of it, unless it is much busier) or load "
            "(the least loaded)", "routing", "prefix|load",
            choices=ROUTINGS, panel=SERVING),
    Setting("--no-metrics", "flag", "Keep no Prometheus metrics: GET /metrics answers 404 and finished requests are "
            "not counted (exo-p2p top then shows no tok/s)", "metrics", inverted=True,
            type=bool, panel=LOGS),
    Setting("--no-request-records", "flag", "Keep no record of finished requests: no request.finished log line, no "
            "requests.jsonl, GET /requests answers 404", "request_records", inverted=True,
            type=bool, panel=LOGS),
    Setting("--metrics-loopback-open", "flag", "Serve GET /metrics without an API key to clients on this machine "
            "(loopback addresses), for a local Prometheus; other clients still need a key", "metrics_loopback_open",
            type=bool, panel=LOGS),
    Setting("--request-log-bytes", "bytes", "Size of requests.jsonl in the data dir (one record per finished "
            "request) before it rotates to requests.jsonl.1; 0: no file (records still go to the log)",
            "request_log_bytes", "BYTES",
            type=int, min=0, panel=LOGS),
    Setting("--log-request-text", "flag", "Request records also carry the prompt and the output text (off: counts, "
            "times and ids only)", "log_request_text",
            type=bool, panel=LOGS),
    Setting("--join", "token", "Join a closed cluster with a token from `exo-p2p invite` on a member (its secret is "
            "kept in the data dir: later starts need no flag)", None, "TOKEN", panel=NET),
    Setting("--fault-hook", "KEY=VALUE, repeatable", "Tests only: KEY=VALUE fault injected into runners "
            "(fail=loading, stall=loading|warmup, ...) or into received gossip (gossip_drop=P, gossip_dup=P, "
            "gossip_reorder=K)", "fault_hooks", repeatable=True, hidden=True,
            check=checks.fault_hooks),
)
SETTINGS: dict[str, Setting] = {s.flag: s for s in _SETTINGS}
"""Every flag of ``exo-p2p node``, by flag, in ``--help`` order."""


ENVIRONMENT = (
    EnvVar("EXO_P2P_API", "client commands", "The node's API URL (without /v1) when no --api is given; "
           f"default http://{DEFAULT_API_HOST}:{DEFAULT_API_PORT}"),
    EnvVar("EXO_P2P_API_KEY", "client commands", "client commands send it as Authorization: Bearer KEY"),
    EnvVar("EXO_P2P_BLAS", "node (runners)", "The BLAS library file runners preload instead of the one found "
           "(/usr/lib/<triplet>/openblas-pthread/...); empty: none"),
    EnvVar("EXO_P2P_RUNNER_LOG", "runners", "Set by the node for its runners (log format and node name); "
           "not a setting"),
    EnvVar("XDG_DATA_HOME", "node, client commands", "Base of the default data dir ($XDG_DATA_HOME/exo-p2p) "
           "when neither --data-dir nor EXO_P2P_HOME is given"),
    EnvVar("OLLAMA_MODELS", "node", "Ollama's models dir when --ollama-models is not given (as Ollama reads it)"),
    EnvVar("HF_HUB_CACHE", "node", "The Hugging Face cache whose MLX-format models the node lists, read-only"),
    EnvVar("HF_ENDPOINT", "node", "The model hub a node reads models no node holds from (default "
           "https://huggingface.co)"),
    EnvVar("HF_TOKEN", "node", "The token a node sends the model hub (else the one `hf auth login` stored)"),
    EnvVar("HF_HUB_OFFLINE", "node", "1: never ask a model hub (as --offline)"),
    EnvVar("HF_HOME", "node", "$HF_HOME/hub is the Hugging Face cache when HF_HUB_CACHE is not set"),
    EnvVar("OPENBLAS_NUM_THREADS", "runners", "Set by the supervisor to the cores the node offers; other "
           "OPENBLAS_* variables pass through to runners"),
)
"""Environment variables the code reads besides (or as well as) the flags' own."""
