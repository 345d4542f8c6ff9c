"""The ``exo-p2p`` CLI against the fake node API of ``tests/support/fake_node.py`` served on
127.0.0.1 (docs/cli.md): ``chat``, one prompt or interactive, read from the
SSE stream.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.fake_node import error_lines, invoke, served
from tests.support.fake_node import fast_polls  # noqa: F401  (autouse)


def _chat_bodies(served) -> list[dict]:
    return [b for m, p, _, b in served.node.requests if p == "/v1/chat/completions"]


@pytest.mark.integration
def test_chat_streams_text_from_sse(served):
    served.node.place({"model": "smollm2-135m-instruct"})
    served.node.instances["inst0001-smollm2-135m-instruct"]["status"] = "ready"
    result = invoke(
        ["chat", "What is the capital of France?", "--max-tokens", "20", "--temperature", "0", "--system", "Be brief.", "--api", served.url]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "The capital of France is Paris.\n"
    (body,) = _chat_bodies(served)
    assert body["model"] == "smollm2-135m-instruct" and body["stream"] is True
    assert (body["max_tokens"], body["temperature"]) == (20, 0.0)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
    ]


@pytest.mark.integration
def test_chat_model_defaults(served):
    assert invoke(["chat", "hi", "--api", served.url]).exit_code == 0
    assert _chat_bodies(served)[-1]["model"] == "smollm2-135m-instruct"  # nothing placed
    served.node.place({"model": "other-model"})
    served.node.instances["inst0001-other-model"]["status"] = "ready"
    assert invoke(["chat", "hi", "--api", served.url]).exit_code == 0
    assert _chat_bodies(served)[-1]["model"] == "other-model"
    assert invoke(["chat", "hi", "-m", "third", "--api", served.url]).exit_code == 0
    assert _chat_bodies(served)[-1]["model"] == "third"
    assert "max_tokens" not in _chat_bodies(served)[-1]


@pytest.mark.integration
def test_chat_error_mid_stream_exits_1(served):
    served.node.chat_error_after = 2
    result = invoke(["chat", "hi", "--api", served.url])
    assert result.exit_code == 1
    assert result.stdout.startswith("The capital of France")
    assert error_lines(result) == ["error: runner died while generating"]


@pytest.mark.integration
def test_interactive_chat_keeps_the_conversation(served):
    result = invoke(["chat", "--api", served.url], input="hello\n\nagain\n/bye\nnever sent\n")
    assert result.exit_code == 0, result.output
    first, second = _chat_bodies(served)
    assert first["messages"] == [{"role": "user", "content": "hello"}]
    assert second["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "again"},
    ]
    assert result.stdout.count("The capital of France is Paris.\n") == 2


_line_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"))


@given(st.lists(st.lists(_line_text, min_size=1, max_size=3), max_size=6))
def test_sse_data_round_trips(events):
    from exo_p2p.cli.node_api.sse import iter_sse_data

    lines: list[str] = [": keep-alive comment", ""]
    for event in events:
        lines += ["event: message"] + [f"data: {part}" for part in event] + [""]
    assert list(iter_sse_data(lines)) == ["\n".join(e) for e in events]


@given(st.lists(st.text(min_size=1, max_size=8), max_size=10))
def test_chat_deltas_concatenate_and_stop_at_done(pieces):
    from exo_p2p.cli.node_api.sse import chat_deltas

    payloads = [json.dumps({"choices": [{"index": 0, "delta": {"content": p}}]}) for p in pieces]
    payloads += ["[DONE]", json.dumps({"choices": [{"delta": {"content": "after done"}}]})]
    assert "".join(chat_deltas(payloads)) == "".join(pieces)


@pytest.mark.integration
def test_length_limit_is_said_on_stderr(served):
    served.node.finish_reason = "length"
    result = invoke(["chat", "hi", "--max-tokens", "4", "--api", served.url])
    assert result.exit_code == 0, result.output
    assert result.stdout == "The capital of France is Paris.\n"  # stdout keeps only the answer
    assert "cut at the length limit of 4 tokens" in result.stderr and "--max-tokens 16" in result.stderr
    served.node.finish_reason = "stop"
    result = invoke(["chat", "hi", "--api", served.url])
    assert "length limit" not in result.stderr


@pytest.mark.integration
@pytest.mark.parametrize("prompt", ["", "   ", "\n\t"])
def test_empty_prompt_is_refused(served, prompt):
    for command in (["chat", prompt], ["run", "smollm2-135m-instruct", prompt]):
        served.node.place({"model": "smollm2-135m-instruct"})
        result = invoke([*command, "--api", served.url])
        assert result.exit_code == 2
        (line,) = error_lines(result)
        assert line.startswith("error: the prompt is empty")
    assert served.paths("POST").count("/v1/chat/completions") == 0


@pytest.mark.integration
def test_repl_leaves_a_newline_on_ctrl_c(served):
    from exo_p2p.cli.chat.session import repl
    from exo_p2p.cli.node_api.client import NodeClient

    notes = []

    def read(prompt):
        raise KeyboardInterrupt

    with NodeClient(served.url) as client, pytest.raises(KeyboardInterrupt):
        repl(client, "m", read=read, note=notes.append)
    assert notes[-1] == ""
