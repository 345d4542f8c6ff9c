"""Counting a prompt's tokens on this node (``POST /v1/messages/count_tokens``, docs/api.md):
the tokenizers, one per model, loaded in a thread and kept, at most ``TOKENIZER_CACHE_MODELS``.

Loading a tokenizer first imports mlx-lm and transformers (~1 s of CPU, over 10 s on a busy
2-core machine) and then reads the model's tokenizer files, so a model's first count would
take that long. The node therefore loads the tokenizer of every model placed on it while the
instance loads (``TokenCounter.run``, the pure rule ``models_to_preload``), in a thread: the
API's trio loop never blocks on it, and a count that comes while the load is in flight waits
for that load instead of starting another.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
import trio

from exo_p2p.limits import check_nofile
from exo_p2p.models.errors import ModelNotFoundError
from exo_p2p.content.system_turns import messages_for_template
from exo_p2p.types import GenerationParams, State

log = structlog.get_logger(__name__)

TOKENIZER_CACHE_MODELS = 4
"""Tokenizers one node keeps at most (models; the least recently used goes first). A tokenizer
holds its vocabulary and merges: a few MiB to ~50 MiB for a large vocabulary."""


def models_to_preload(state: State, node_id: str, boot_id: str, limit: int = TOKENIZER_CACHE_MODELS) -> tuple[str, ...]:
    """The models whose tokenizer this node loads ahead of any request: those of the live
    (not failed) instances with a shard on ``node_id`` placed in this boot (``boot_id``; a
    restarted node's instances from before are never run here, so its start stays light),
    each once, in instance id order, at most ``limit`` of them (so preloading never evicts
    another preloaded tokenizer)."""
    models: list[str] = []
    for _, instance in sorted(state.instances.items()):
        shard = instance.shard_for(node_id)
        if (instance.failed_reason is None and shard is not None and shard.boot_id == boot_id
                and instance.model_id not in models):
            models.append(instance.model_id)
    return tuple(models[:limit])


def load_tokenizer(path: Path) -> Any:
    """The tokenizer of the MLX model directory ``path`` (mlx-lm's ``TokenizerWrapper``, the
    one the runners use, so counts match what a generation's prompt takes). Blocking: imports
    mlx-lm on first use, reads the files; run it in a thread. The node's open-file limit is
    checked after (mlx-lm's import tries to lower it: ``exo_p2p.limits``)."""
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer  # lazy: imports MLX (seconds)

    tokenizer = mlx_load_tokenizer(path)
    check_nofile("mlx-lm imported")
    return tokenizer


class _Entry:
    """One model's tokenizer: loading (``done`` not set), loaded (``tokenizer``), failed
    (``error``) or given up by its cancelled caller (``cancelled``)."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.tokenizer: Any = None
        self.error: Exception | None = None
        self.cancelled = False


class TokenCounter:
    """Counts prompt tokens with the tokenizers of this node's models.

    ``resolve(model_id) -> Path`` (blocking, run in a thread) gives the model's MLX directory
    and raises ``ModelNotFoundError`` for a model this node does not store; ``load(path)``
    (blocking) gives its tokenizer (default: ``load_tokenizer``). Tokenizers are kept in
    least-recently-used order, at most ``limit``; a model is loaded once at a time (a second
    caller waits for the load in flight), a failed load is forgotten (the next call tries
    again). ``run`` preloads the tokenizers of the models placed on this node; call ``wake``
    after each State change.
    """

    def __init__(self, resolve: Callable[[str], Path], load: Callable[[Path], Any] = load_tokenizer,
                 *, limit: int = TOKENIZER_CACHE_MODELS) -> None:
        self._resolve = resolve
        self._load = load
        self._limit = limit
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._wake = trio.Event()

    def cached(self) -> tuple[str, ...]:
        """The models whose tokenizer is loaded, least recently used first."""
        return tuple(m for m, e in self._entries.items() if e.done.is_set() and e.error is None)

    def wake(self) -> None:
        """Look at the State again (it changed)."""
        self._wake.set()

    async def tokenizer(self, model_id: str, *, reason: str = "request") -> Any:
        """``model_id``'s tokenizer, loaded now in a thread unless kept or loading (a load in
        flight whose caller was cancelled is taken over). Raises ``KeyError`` when this node
        does not store the model; what ``load`` raises otherwise."""
        entry = self._entries.get(model_id)
        while entry is not None and not entry.done.is_set():
            await entry.done.wait()
            entry = self._entries.get(model_id) if entry.cancelled else entry
        if entry is None:
            entry = self._entries[model_id] = _Entry()
            await self._fill(model_id, entry, reason)
        if entry.error is not None:
            raise KeyError(model_id) if isinstance(entry.error, ModelNotFoundError) else entry.error
        if model_id in self._entries:
            self._entries.move_to_end(model_id)
        return entry.tokenizer

    async def _fill(self, model_id: str, entry: _Entry, reason: str) -> None:
        started = time.monotonic()
        try:
            path = await trio.to_thread.run_sync(self._resolve, model_id)
            # a pure read: a node stopping does not wait for it (a GGUF import in resolve it does)
            entry.tokenizer = await trio.to_thread.run_sync(self._load, path, abandon_on_cancel=True)
        except BaseException as exc:
            entry.cancelled = not isinstance(exc, Exception)  # waiters load it themselves
            entry.error = None if entry.cancelled else exc
            if self._entries.get(model_id) is entry:
                del self._entries[model_id]  # the next call tries again
            if entry.cancelled:
                raise
            return
        finally:
            entry.done.set()
        log.info("tokenizer loaded", model_id=model_id, reason=reason, seconds=round(time.monotonic() - started, 3))
        self._evict()

    def _evict(self) -> None:
        loaded = [m for m, e in self._entries.items() if e.done.is_set()]
        for model_id in loaded[: max(0, len(self._entries) - self._limit)]:
            del self._entries[model_id]

    async def count(self, model_id: str, params: GenerationParams) -> int:
        """Tokens of ``params``'s prompt (its text, or its messages through the chat template
        with the generation prompt added, late system messages as ``exo_p2p.content.system_turns``
        says) for ``model_id``, counted in a thread. Raises
        ``KeyError`` when this node does not store the model, ``ValueError`` when its chat
        template fails."""
        tokenizer = await self.tokenizer(model_id)

        def count() -> int:
            if params.prompt is not None:
                return len(tokenizer.encode(params.prompt))
            messages = [{"role": m.role, "content": m.content} for m in params.messages]
            try:
                messages = messages_for_template(
                    lambda ms: tokenizer.apply_chat_template(ms, add_generation_prompt=True, tokenize=False), messages)
                return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
            except Exception as e:  # noqa: BLE001 - a template error is the request's problem
                raise ValueError(f"the chat template of model {model_id} failed: {e}") from None

        return await trio.to_thread.run_sync(count)

    async def encode(self, model_id: str, texts: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """``texts`` tokenized for ``model_id`` (special tokens added, no chat template: an
        embedding's inputs), in a thread. Raises ``KeyError`` when this node does not store the model."""
        tokenizer = await self.tokenizer(model_id)
        return await trio.to_thread.run_sync(lambda: tuple(tuple(tokenizer.encode(t)) for t in texts))

    async def run(self, get_state: Callable[[], State], node_id: str, boot_id: str) -> None:
        """Preload the tokenizers of the models placed on ``node_id`` in its boot ``boot_id``
        (``models_to_preload``), each once while it stays placed, in the background; runs
        until cancelled. A model this node does not store (a rank that fetched only its shard)
        or whose tokenizer fails to load is logged and left for a request to try again."""
        tried: set[str] = set()
        async with trio.open_nursery() as nursery:
            while True:
                wanted = models_to_preload(get_state(), node_id, boot_id, self._limit)
                tried &= set(wanted)  # a model placed again later is tried again
                for model_id in wanted:
                    if model_id not in tried and model_id not in self._entries:
                        tried.add(model_id)
                        nursery.start_soon(self._preload, model_id)
                await self._wake.wait()
                self._wake = trio.Event()

    async def _preload(self, model_id: str) -> None:
        try:
            await self.tokenizer(model_id, reason="placed")
        except KeyError:
            log.debug("tokenizer not preloaded: model not stored here", model_id=model_id)
        except Exception as exc:  # noqa: BLE001 - a request will try again and report it
            log.warning("tokenizer not preloaded", model_id=model_id, error=f"{type(exc).__name__}: {exc}")
