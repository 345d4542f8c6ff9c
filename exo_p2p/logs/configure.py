"""Logging of a node (``--log-format json|console``, ``--log-level``, ``--log-file``).

Everything a node process writes goes through one stdlib handler with structlog's
``ProcessorFormatter``: the node's own structlog events and the stdlib records of
hypercorn, libp2p and any other library are rendered alike, as one JSON object per line
(``json``) or as console text. Every line carries the node's name (``node=``), so the lines
of several nodes in one terminal or file say which node wrote them. Warnings
(``warnings.warn``) and uncaught exceptions become log records too.

Runner subprocesses write to the same stream; ``configure_runner_output`` (called first
thing in a runner) makes their Python-level stdout/stderr lines log records of the same
shape, from the settings the node leaves in the environment (``RUNNER_LOG_ENV``).
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import structlog

RUNNER_LOG_ENV = "EXO_P2P_RUNNER_LOG"
"""Environment variable a node sets for its runners: JSON ``{"format", "node"}``."""

_stream: IO[str] = sys.stderr
_format = "console"
_user_stderr: IO[str] | None = None  # the terminal's stderr, kept when the log goes to a file


def log_stream() -> IO[str]:
    """The stream the log goes to (stderr, or the ``--log-file``)."""
    return _stream


def announce(banner: list[str], facts: list[Any]) -> None:
    """Say the start-up ``facts`` (``exo_p2p.node.announce.Fact``) once each: with the console
    format as the ``banner`` lines (which carry their text), with JSON as one log record per
    fact (its ``event`` at its ``level``, with its ``fields``) and no banner."""
    if _format != "json":
        print("\n".join(banner), file=_stream, flush=True)
        return
    logger = structlog.get_logger("exo_p2p.node")
    for fact in facts:
        getattr(logger, fact.level)(fact.event, **fact.fields)


def report_error(text: str) -> None:
    """A node's fatal one-line error: ``error: text`` on the user's stderr (the terminal, also
    when the log goes to a file) and an error record in the log; in JSON, stderr only gets
    the plain line when the log is elsewhere (a JSON log stays JSON only)."""
    if _format == "json" or _user_stderr is not None:
        structlog.get_logger("exo_p2p.node").error(text)
    if _format != "json" and _user_stderr is None:
        print(f"error: {text}", file=sys.stderr, flush=True)
    elif _user_stderr is not None:
        print(f"error: {text}", file=_user_stderr, flush=True)


def _add_node(name: str | None):  # type: ignore[no-untyped-def]
    def add(_logger: Any, _method: str, event_dict: dict) -> dict:
        if name:
            event_dict.setdefault("node", name)
        return event_dict

    return add


def _renderer(fmt: str, stream: IO[str]):  # type: ignore[no-untyped-def]
    if fmt == "json":
        return structlog.processors.JSONRenderer(default=str)
    colors = bool(getattr(stream, "isatty", lambda: False)())
    return structlog.dev.ConsoleRenderer(colors=colors)


def configure_logging(
    fmt: str = "console", level: str = "info", *, node_name: str | None = None, log_file: Path | None = None
) -> IO[str]:
    """Route structlog and stdlib logging to stderr (or ``log_file``, appended, line
    buffered) as JSON lines or console text, each line with ``node=node_name``; returns the
    stream. Also sets ``RUNNER_LOG_ENV`` so runners started later log the same way.
    Raises ``OSError`` when ``log_file`` cannot be opened."""
    global _stream, _format, _user_stderr
    lvl = getattr(logging, level.upper(), logging.INFO)
    stream: IO[str] = sys.stderr
    if log_file is not None:
        stream, _user_stderr = _log_to_file(Path(log_file))
    _stream, _format = stream, fmt
    _route_records(_formatter(fmt, stream, node_name, lvl), stream, lvl)
    _log_uncaught()
    os.environ[RUNNER_LOG_ENV] = json.dumps({"format": fmt, "node": node_name})
    return stream


def _log_to_file(log_file: Path) -> tuple[IO[str], IO[str]]:
    """Open ``log_file`` (appended, line buffered, its directory made) and make fds 1 and 2
    write to it, so whatever writes there (runners, C libraries) goes to the file too.
    Returns the file and a copy of the terminal's stderr, kept for the one-line start errors."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    stream = open(log_file, "a", buffering=1, encoding="utf-8")
    sys.stderr.flush()
    sys.stdout.flush()
    user_stderr = os.fdopen(os.dup(2), "w", buffering=1)
    os.dup2(stream.fileno(), 1)
    os.dup2(stream.fileno(), 2)
    return stream, user_stderr


def _formatter(fmt: str, stream: IO[str], node_name: str | None, lvl: int) -> logging.Formatter:
    """Configure structlog (events at ``lvl`` and above, with level, UTC ISO time and
    ``node``) and return the stdlib formatter that renders its events and other libraries'
    records alike, as JSON or console text for ``stream``."""
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_node(node_name),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _renderer(fmt, stream),
        ],
    )


def _route_records(formatter: logging.Formatter, stream: IO[str], lvl: int) -> None:
    """Every stdlib record at ``lvl`` and above (and ``warnings.warn``) to one handler on
    ``stream`` rendered by ``formatter``; other libraries' loggers at their levels below."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(lvl)
    # loggers that do not propagate and have no handler (py-libp2p's "libp2p") end in
    # logging's last-resort handler, which writes bare messages: ours renders them too
    last_resort = logging.StreamHandler(stream)
    last_resort.setFormatter(formatter)
    last_resort.setLevel(max(lvl, logging.WARNING))  # as logging's own last resort
    logging.lastResort = last_resort
    logging.captureWarnings(True)
    # stdlib records of other libraries: warnings and above unless debugging
    for name in ("hypercorn", "exo_p2p.api.server", "asyncio", "httpx", "httpx2", "httpcore", "multiaddr"):
        logging.getLogger(name).setLevel(max(lvl, logging.WARNING) if name != "exo_p2p.api.server" else lvl)
    # py-libp2p logs an ERROR for every failed re-dial of a peer that is down; our re-dialler
    # retries with backoff and reports peers itself, so keep those out of the node's log.
    for noisy in ("libp2p.transport.tcp.tcp", "libp2p.network.swarm", "libp2p.discovery.mdns"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    # libp2p's own warnings (failed handshakes of peers going away, failed health pings) are
    # what our cluster layer turns into peer events; its errors still show.
    logging.getLogger("libp2p").setLevel(max(lvl, logging.ERROR))


def _log_uncaught() -> None:
    """Uncaught exceptions, in any thread, become critical records of ``exo_p2p``."""

    def excepthook(kind, value, tb):  # type: ignore[no-untyped-def]
        logging.getLogger("exo_p2p").critical("uncaught exception", exc_info=(kind, value, tb))

    sys.excepthook = excepthook
    threading.excepthook = lambda args: excepthook(args.exc_type, args.exc_value, args.exc_traceback)


class _JsonLines(io.TextIOBase):
    """A text stream that writes each complete line given to it as a JSON log record
    (``{"event": "runner output", "line": ..., "stream": ..., "node": ...}``) to ``target``."""

    def __init__(self, target: IO[str], stream_name: str, node: str | None) -> None:
        self._target = target
        self._name = stream_name
        self._node = node
        self._buffer = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            self._buffer += text
            while "\n" in self._buffer:
                line, self._buffer = self._buffer.split("\n", 1)
                self._emit(line)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._buffer:
                self._emit(self._buffer)
                self._buffer = ""
        self._target.flush()

    def _emit(self, line: str) -> None:
        if not line.strip():
            return
        record = {
            "event": "runner output",
            "line": line,
            "stream": self._name,
            "pid": os.getpid(),
            "level": "warning" if self._name == "stderr" else "info",
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if self._node:
            record["node"] = self._node
        self._target.write(json.dumps(record) + "\n")
        self._target.flush()


def configure_runner_output() -> None:
    """In a runner process: when its node logs JSON, turn what the runner writes through
    ``sys.stdout`` / ``sys.stderr`` (prints, warnings, tracebacks) into JSON lines on the
    node's log stream (the runner's fd 2). C-level writes to fds 1 and 2 (MLX's ring
    backend: "[ring] Socket … was closed by the peer") are made JSON by the supervisor, which
    gives a runner a pipe as fds 1 and 2 in JSON mode (``worker.runner_output``). Does nothing
    for the console format or outside a node."""
    try:
        settings = json.loads(os.environ.get(RUNNER_LOG_ENV) or "{}")
    except ValueError:
        return
    if settings.get("format") != "json":
        return
    node = settings.get("node")
    target = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    sys.stdout = _JsonLines(target, "stdout", node)  # type: ignore[assignment]
    sys.stderr = _JsonLines(target, "stderr", node)  # type: ignore[assignment]
