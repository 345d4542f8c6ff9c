"""Reasoning efforts as thinking budgets (``GenerationParams.thinking_budget``, tokens).

OpenAI's ``reasoning_effort`` (chat) / ``reasoning.effort`` (Responses) and Ollama's ``think``
levels name an effort, not a count; the runner needs a count to force the end of reasoning
(``worker.engine.think_budget``). The mapping is LiteLLM's (the proxy most agents reach
non-OpenAI models through; its ``DEFAULT_REASONING_EFFORT_*_THINKING_BUDGET`` constants:
minimal 128, low 1024, medium 2048, high 4096), with ``xhigh`` one doubling above ``high``.
``none`` turns thinking off (no budget); ``true`` / an effort-less request thinks unbounded.
"""

from __future__ import annotations

from typing import Any

EFFORT_BUDGETS: dict[str, int] = {"minimal": 128, "low": 1024, "medium": 2048, "high": 4096, "xhigh": 8192}
"""Reasoning tokens allowed per effort level (see the module docstring)."""


def effort_budget(effort: Any) -> int | None:
    """The budget of an effort level (a key of ``EFFORT_BUDGETS``); None for anything else
    (``none``, a boolean, absent: the caller has validated the value already)."""
    return EFFORT_BUDGETS.get(effort) if isinstance(effort, str) else None
