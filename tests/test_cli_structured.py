"""``exo-p2p chat|run --json`` and ``--schema FILE`` (docs/cli.md): the ``response_format``
the CLI builds (unit), what it sends to a fake node and how it refuses a bad schema file
(the CLI in process against ``tests.test_cli``'s fake API), and a real node serving the tiny
synthetic model answering the CLI, run as a subprocess, with JSON that validates, and with
the node's 400 for a schema llguidance refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from exo_p2p.cli.chat.session import request_body
from exo_p2p.cli.errors import CliError
from exo_p2p.cli.chat.structured import MAX_SCHEMA_BYTES, read_schema, response_format, schema_name
from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.cluster import NodeProcess
from tests.support.fake_node import Served, error_lines, invoke

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}}
MODEL = "tiny-structured"


# -- the request body (unit) -----------------------------------------------------------------


def test_json_is_any_object_and_a_schema_file_is_strict_json_schema(tmp_path: Path) -> None:
    path = tmp_path / "my person.schema.json"
    path.write_text(json.dumps(PERSON))
    assert response_format(False, None) is None
    assert response_format(True, None) == {"type": "json_object"}
    assert response_format(False, path) == {
        "type": "json_schema", "json_schema": {"name": "my_person_schema", "schema": PERSON, "strict": True}}
    body = request_body("m", [{"role": "user", "content": "hi"}], response_format={"type": "json_object"})
    assert body["response_format"] == {"type": "json_object"}
    assert "response_format" not in request_body("m", [])


def test_schema_names_fit_openai_rule() -> None:
    assert schema_name(Path("a/b/person.json")) == "person"
    assert schema_name(Path("ä ö.json")) == "___"
    assert schema_name(Path("x" * 100 + ".json")) == "x" * 64
    assert schema_name(Path(".json")) == "_json"
    assert schema_name(Path("")) == "schema"


@pytest.mark.parametrize("content, says", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "holds a JSON array; a JSON schema is an object"),
    ('"text"', "holds a JSON string"),
    ("3", "holds a JSON number"),
    (b"\xff\xfe", "is not valid JSON"),
    (" " * (MAX_SCHEMA_BYTES + 1), f"a node accepts at most {MAX_SCHEMA_BYTES}"),
])
def test_a_bad_schema_file_is_a_clear_usage_error(tmp_path: Path, content: str | bytes, says: str) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(CliError) as caught:
        read_schema(path)
    assert says in caught.value.message and str(path) in caught.value.message and caught.value.exit_code == 2


def test_a_missing_file_and_both_options_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="cannot read the schema file .*missing.json") as caught:
        response_format(False, tmp_path / "missing.json")
    assert caught.value.exit_code == 2
    (tmp_path / "s.json").write_text("{}")
    with pytest.raises(CliError, match="--json or --schema, not both"):
        response_format(True, tmp_path / "s.json")


# -- against a fake node (the CLI in process) ------------------------------------------------


@pytest.fixture
def served():
    s = Served()
    yield s
    s.close()


def _sent(served: Served) -> list[dict]:
    return [b for m, p, _, b in served.node.requests if p == "/v1/chat/completions"]


@pytest.mark.integration
def test_chat_and_run_send_the_format(served: Served, tmp_path: Path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    served.node.chat_tokens = ['{"name"', ': "Ada"', "}"]
    assert invoke(["chat", "hi", "--json", "--api", served.url]).exit_code == 0
    assert _sent(served)[-1]["response_format"] == {"type": "json_object"}
    result = invoke(["chat", "--schema", str(schema), "--api", served.url], input="one\ntwo\n/bye\n")
    assert result.exit_code == 0, result.output
    first, second = _sent(served)[-2:]
    assert first["response_format"] == second["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    served.node.place({"model": "smollm2-135m-instruct"})
    served.node.instances["inst0001-smollm2-135m-instruct"]["status"] = "ready"
    result = invoke(["run", "smollm2-135m-instruct", "hi", "--json", "--api", served.url])
    assert result.exit_code == 0, result.output
    assert _sent(served)[-1]["response_format"] == {"type": "json_object"}
    assert invoke(["chat", "hi", "--api", served.url]).exit_code == 0
    assert "response_format" not in _sent(served)[-1]


@pytest.mark.integration
def test_a_json_answer_cut_at_the_length_limit_exits_1(served: Served) -> None:
    """Half an object on stdout is not an answer a script may take: exit 1, and the error
    says how to get the whole one."""
    served.node.chat_tokens, served.node.finish_reason = ['{"name"', ': "Ad'], "length"
    result = invoke(["chat", "hi", "--json", "--max-tokens", "2", "--api", served.url])
    assert result.exit_code == 1, result.output
    assert error_lines(result)[-1] == "error: the answer is not complete JSON (cut before its end); pass --max-tokens 8"
    served.node.chat_tokens = ["not", " json"]
    assert invoke(["chat", "hi", "--api", served.url]).exit_code == 0, "without --json any text is an answer"


@pytest.mark.integration
def test_a_bad_schema_file_sends_nothing_and_exits_2(served: Served, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    for command in (["chat", "hi"], ["chat"], ["run", "smollm2-135m-instruct", "hi"]):
        result = invoke([*command, "--schema", str(bad), "--api", served.url])
        assert result.exit_code == 2, result.output
        (line,) = error_lines(result)
        assert line.startswith(f"error: the schema file {bad} is not valid JSON")
    result = invoke(["chat", "hi", "--json", "--schema", str(bad), "--api", served.url])
    assert result.exit_code == 2 and "not both" in result.stderr
    assert _sent(served) == [] and served.paths("POST") == []


# -- a real node (the CLI as a subprocess) ---------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    make_synthetic_model(models / MODEL, n_layers=2, hidden_size=64, intermediate_size=128, seed=11)
    n = NodeProcess(tmp_path_factory.mktemp("node"), extra_args=["--models-dir", str(models)])
    try:
        n.start()
        n.place_and_wait(MODEL, timeout=120)
        yield n
    finally:
        n.stop()


def _cli(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("EXO_P2P_API", "EXO_P2P_API_KEY")}
    return subprocess.run([sys.executable, "-m", "exo_p2p", "chat", *args, "--api", url, "-m", MODEL],
                          capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.integration
def test_a_real_node_answers_the_cli_with_valid_json(node, tmp_path: Path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    proc = _cli(node.url, "give me a person", "--schema", str(schema), "--temperature", "0", "--max-tokens", "200")
    assert proc.returncode == 0, proc.stderr
    assert "finish reason: stop" in proc.stderr, proc.stderr
    jsonschema.validate(json.loads(proc.stdout), PERSON)
    proc = _cli(node.url, "anything", "--json", "--temperature", "0", "--max-tokens", "200")
    assert proc.stdout.startswith("{"), proc.stderr
    if "finish reason: stop" in proc.stderr:
        assert proc.returncode == 0 and isinstance(json.loads(proc.stdout), dict), proc.stderr
    else:
        assert proc.returncode == 1 and "cut at the length limit" in proc.stderr and "not complete JSON" in proc.stderr
    bad = tmp_path / "bad-schema.json"
    bad.write_text(json.dumps({"type": "nope"}))
    proc = _cli(node.url, "x", "--schema", str(bad))
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and "nope" in line  # llguidance's message: "Invalid type: nope"
