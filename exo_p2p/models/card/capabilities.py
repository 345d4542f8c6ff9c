"""What a model can do, read from its chat template (Ollama's ``/api/show`` ``capabilities``).

``completion`` always; ``tools`` when the template renders a ``tools`` list (the template
knows tool calls natively, so clients that offer tools only to such models, as VS Code
Copilot's agent mode does, list it); ``thinking`` when the template knows reasoning
(``enable_thinking``, ``reasoning_content`` or a ``<think>`` marker); ``vision`` when the
model's config has a ``vision_config`` (Qwen2/2.5/3-VL, Gemma 3, Llama 4, Mistral 3: a vision
tower beside the language model, docs/models.md "Vision models"). Pure but for
``model_dir_template``, which reads a model directory's files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_TOOLS = re.compile(r"\btools\b")
_THINKING = ("enable_thinking", "reasoning_content", "<think>")
MAX_TEMPLATE_BYTES = 1 << 20
"""A chat template file larger than this (bytes) is not read: no model's is near it."""


def template_capabilities(template: str | None) -> tuple[str, ...]:
    """``("completion", ["tools"], ["thinking"])`` of chat template ``template`` (None: no
    template, ``("completion",)``)."""
    caps = ["completion"]
    if template and _TOOLS.search(template):
        caps.append("tools")
    if template and any(marker in template for marker in _THINKING):
        caps.append("thinking")
    return tuple(caps)


def model_capabilities(template: str | None, config: Mapping[str, Any]) -> tuple[str, ...]:
    """``template_capabilities(template)``, then ``vision`` when ``config`` (config.json) has a
    ``vision_config`` object."""
    vision = ("vision",) if isinstance(config.get("vision_config"), Mapping) else ()
    return template_capabilities(template) + vision


def template_of(jinja: bytes | None, tokenizer_config: bytes | None) -> str | None:
    """The chat template of a model's files: ``chat_template.jinja``'s text, else
    ``tokenizer_config.json``'s ``chat_template`` (a string, or the ``default`` of a named
    list); None when neither holds one or a file does not decode."""
    try:
        if jinja is not None and len(jinja) <= MAX_TEMPLATE_BYTES:
            return jinja.decode("utf-8")
        if tokenizer_config is None:
            return None
        template = json.loads(tokenizer_config).get("chat_template")
    except (ValueError, AttributeError):
        return None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or named.get("tool_use")
    return template if isinstance(template, str) else None


def model_dir_template(model_dir: Path) -> str | None:
    """``template_of`` a model directory's ``chat_template.jinja`` and
    ``tokenizer_config.json`` (a file over 16 × ``MAX_TEMPLATE_BYTES`` or unreadable is
    left out)."""
    def read(name: str) -> bytes | None:
        path = model_dir / name
        try:
            return path.read_bytes() if path.is_file() and path.stat().st_size <= 16 * MAX_TEMPLATE_BYTES else None
        except OSError:
            return None

    return template_of(read("chat_template.jinja"), read("tokenizer_config.json"))
