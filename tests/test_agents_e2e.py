"""Agent frameworks against a real node with the embedded model (no native tool format: the
generic one, docs/api.md#tools-and-reasoning): the OpenAI Agents SDK and LangChain's
``bind_tools`` each complete a two-step tool task — the model calls the tool (forced by
``tool_choice``), the framework runs it and sends the result back, the model answers."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tests.conftest import EMBEDDED_MODEL

pytestmark = pytest.mark.e2e

CALLED: list[tuple[int, int]] = []


def add(a: int, b: int) -> int:
    """Add two integers."""
    CALLED.append((a, b))
    return a + b


def test_openai_agents_sdk_runs_a_tool_and_answers(embedded_node) -> None:
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{embedded_node.url}/v1", api_key="unused", max_retries=0, timeout=120)
    model = agents.OpenAIChatCompletionsModel(model=EMBEDDED_MODEL, openai_client=client)
    settings = agents.ModelSettings(tool_choice="add", temperature=0, max_tokens=60)

    class AnswerAfterTheTool(agents.AgentHooks):
        """Once the tool ran, the next turn may not call it again (the tiny model would)."""

        async def on_tool_end(self, context, agent, tool, result) -> None:  # type: ignore[no-untyped-def]
            agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice="none")

    agent = agents.Agent(name="calc", instructions="Use the add tool to add numbers.", tools=[agents.function_tool(add)],
                         model=model, model_settings=settings, reset_tool_choice=False, hooks=AnswerAfterTheTool())
    CALLED.clear()
    result = asyncio.run(agents.Runner.run(agent, "What is 2 plus 3?", max_turns=3))
    calls = [i for i in result.new_items if i.type == "tool_call_item"]
    outputs = [i for i in result.new_items if i.type == "tool_call_output_item"]
    assert calls and outputs and CALLED, result.new_items
    assert outputs[0].output == sum(CALLED[0])
    assert isinstance(result.final_output, str) and result.final_output


def test_langchain_bind_tools_runs_a_tool_and_answers(embedded_node) -> None:
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    add_tool = tool(add)
    llm = ChatOpenAI(model=EMBEDDED_MODEL, base_url=f"{embedded_node.url}/v1", api_key="unused", temperature=0, max_tokens=60,
                     max_retries=0, timeout=120)
    messages = [HumanMessage("What is 2 plus 3? Use the add tool.")]
    first = llm.bind_tools([add_tool], tool_choice="add").invoke(messages)
    assert first.tool_calls and first.tool_calls[0]["name"] == "add", first
    messages.append(first)
    for call in first.tool_calls:
        messages.append(ToolMessage(str(add_tool.invoke(call["args"])), tool_call_id=call["id"]))
    final = llm.bind_tools([add_tool]).invoke(messages)
    assert final.content or final.tool_calls
    assert final.response_metadata["finish_reason"] in ("stop", "length", "tool_calls")
