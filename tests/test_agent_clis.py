"""The coding agents' own CLIs, unmodified, against a real node serving the agent synthetic
model (a 64k context, a Qwen-like tool template): Claude Code (``claude -p``, Anthropic
Messages), Codex (``codex exec``, Responses), opencode (``opencode run``, chat completions) and
aider (``aider --message``, chat completions through litellm). Each exits 0 with an answer;
the three that use tools also make a tool-call round trip: the model is forced to call the
CLI's file-reading tool on a file the test wrote (``tests/support/net/agent_proxy.py`` sets
``tool_choice`` and narrows that tool's arguments, as a random-weight model cannot choose), the
CLI runs it and sends the file's content back, and the model answers.

The CLIs come from ``bash scripts/install_agents.sh`` (pinned, in ``.agents/``; ``install.sh
--test`` runs it); a CLI that is not installed skips with that command as the reason. Each runs
with a temporary HOME, every telemetry, update and non-essential-traffic switch it documents
turned off, and a time bound after which its process group is killed (docs/agents.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.net.agent_proxy import AgentProxy
from tests.support.tools_node import AGENT_MODEL, agent_node

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / ".agents"
CONTEXT = 65536
"""The model's context (tokens): room for Claude Code's system prompt and tools with this
tiny model's byte-level tokenizer."""
CLI_TIMEOUT = 600.0
"""Seconds a CLI run may take before its process group is killed. Measured: Claude Code 157 s
(its first request is 37,249 tokens of prefill), the others under a minute, beside a loaded
machine; in a CI run sharing the cores with another run Claude Code went over 300 s, so the bound
is 4x its measured time."""
SECRET = "pelican-4417"
"""The content of the file the forced tool call reads (it must come back in the tool result)."""
TEST_BOUND = CLI_TIMEOUT + 240
"""pytest-timeout's bound per test: the CLI's ``CLI_TIMEOUT`` plus the first test's node start
and model placement (``agent_node``: 120 s) and as much again of slack."""
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(TEST_BOUND)]
OFF = {"NO_COLOR": "1", "CI": "1", "DO_NOT_TRACK": "1"}
"""Switches every CLI reads (no colour, non-interactive, the DO_NOT_TRACK convention)."""


@pytest.fixture(scope="module")
def node(tmp_path_factory):  # type: ignore[no-untyped-def]
    n, _ = agent_node(tmp_path_factory, CONTEXT)
    try:
        yield n
    finally:
        n.stop()


def cli(name: str) -> Path:
    """The installed CLI ``name``, or a skip saying how to install it."""
    path = AGENTS / "aider" / "bin" / "aider" if name == "aider" else AGENTS / "npm" / "node_modules" / ".bin" / name
    if not path.exists():
        pytest.skip(f"{name} is not installed: bash scripts/install_agents.sh")
    return path


def workspace(tmp_path: Path) -> tuple[Path, Path]:
    """A temporary HOME and a project folder in it holding ``notes.txt`` (``SECRET``)."""
    home = tmp_path / "home"
    project = home / "project"
    project.mkdir(parents=True)
    (project / "notes.txt").write_text(SECRET + "\n")
    return home, project


def run(argv: list[str], home: Path, cwd: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    """``argv`` in ``cwd`` with only ``env`` (plus PATH, HOME and the ``OFF`` switches); its whole
    process group is killed after ``CLI_TIMEOUT`` s. Returns the result and the seconds taken."""
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(home), "LANG": "C.UTF-8",
            "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local/share"),
            "XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".local/state"), **OFF, **env}
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CLI_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"{argv[0]} still running after {CLI_TIMEOUT} s: killed\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything it left behind
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), time.monotonic() - started


def report(result: subprocess.CompletedProcess, proxy: AgentProxy) -> str:
    paths = [f"{m} {p}" for m, p, _ in proxy.requests]
    return (f"exit {result.returncode}\nstdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-3000:]}\n"
            f"requests: {paths}\nanswers: {proxy.answers}")


def test_claude_code_answers_after_a_forced_tool_call(node, tmp_path) -> None:
    claude = cli("claude")
    home, project = workspace(tmp_path)
    notes = str(project / "notes.txt")
    with AgentProxy(node.url, "Read", {"file_path": notes}) as proxy:
        env = {"ANTHROPIC_BASE_URL": proxy.url, "ANTHROPIC_API_KEY": "unused", "ANTHROPIC_MODEL": AGENT_MODEL,
               "ANTHROPIC_DEFAULT_HAIKU_MODEL": AGENT_MODEL, "ANTHROPIC_SMALL_FAST_MODEL": AGENT_MODEL,
               "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
               "DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1", "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
               "CLAUDE_CONFIG_DIR": str(home / ".claude")}
        result, took = run([str(claude), "-p", "Read notes.txt and tell me what it says.", "--output-format", "json",
                            "--max-turns", "3"], home, project, env)
        print(f"claude -p: {took:.1f} s, {len(proxy.requests)} requests")
        assert result.returncode == 0, report(result, proxy)
        answer = json.loads(result.stdout)
        assert answer.get("is_error") is False and answer.get("result"), answer
        turns = [b for b in proxy.bodies("/v1/messages") if b.get("tools")]
        results = [block for b in turns for m in b["messages"] if isinstance(m.get("content"), list)
                   for block in m["content"] if block.get("type") == "tool_result"]
        assert results and SECRET in json.dumps(results), report(result, proxy)


def test_codex_answers_after_a_forced_tool_call(node, tmp_path) -> None:
    codex = cli("codex")
    home, project = workspace(tmp_path)
    codex_home = home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(f"""
model = "{AGENT_MODEL}"
model_provider = "exo"
model_context_window = {CONTEXT}
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[model_providers.exo]
name = "exo-p2p"
base_url = "PROXY/v1"
wire_api = "responses"
env_key = "EXO_P2P_KEY"
request_max_retries = 0
stream_max_retries = 0
""")
    with AgentProxy(node.url, "exec_command", {"cmd": "cat notes.txt"}) as proxy:
        config = codex_home / "config.toml"
        config.write_text(config.read_text().replace("PROXY", proxy.url))
        env = {"CODEX_HOME": str(codex_home), "EXO_P2P_KEY": "unused"}
        result, took = run([str(codex), "exec", "--skip-git-repo-check", "Read notes.txt and tell me what it says."],
                           home, project, env)
        print(f"codex exec: {took:.1f} s, {len(proxy.requests)} requests")
        assert result.returncode == 0, report(result, proxy)
        assert result.stdout.strip(), report(result, proxy)
        outputs = [i for b in proxy.bodies("/v1/responses") for i in b.get("input") or []
                   if isinstance(i, dict) and i.get("type") == "function_call_output"]
        assert outputs and SECRET in json.dumps(outputs), report(result, proxy)


def test_opencode_answers_after_a_forced_tool_call(node, tmp_path) -> None:
    opencode = cli("opencode")
    home, project = workspace(tmp_path)
    notes = str(project / "notes.txt")
    with AgentProxy(node.url, "read", {"filePath": notes}) as proxy:
        (project / "opencode.json").write_text(json.dumps({
            "$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
            "provider": {"exo": {"npm": "@ai-sdk/openai-compatible", "name": "exo-p2p",
                                 "options": {"baseURL": f"{proxy.url}/v1", "apiKey": "unused"},
                                 "models": {AGENT_MODEL: {"name": AGENT_MODEL, "limit": {"context": CONTEXT, "output": 4096}}}}},
            "model": f"exo/{AGENT_MODEL}", "small_model": f"exo/{AGENT_MODEL}"}))
        env = {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
               "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_AUTOCOMPACT": "1",
               "OPENCODE_DISABLE_TERMINAL_TITLE": "1", "OPENCODE_DISABLE_CLAUDE_CODE": "1"}
        result, took = run([str(opencode), "run", "Read notes.txt and tell me what it says."], home, project, env)
        print(f"opencode run: {took:.1f} s, {len(proxy.requests)} requests")
        assert result.returncode == 0, report(result, proxy)
        assert result.stdout.strip(), report(result, proxy)
        results = [m for b in proxy.bodies("/v1/chat/completions") for m in b.get("messages") or [] if m.get("role") == "tool"]
        assert results and SECRET in json.dumps(results), report(result, proxy)


def test_aider_answers(node, tmp_path) -> None:
    aider = cli("aider")
    home, project = workspace(tmp_path)
    model = f"openai/{AGENT_MODEL}"
    (project / ".aider.model.metadata.json").write_text(json.dumps({model: {
        "max_input_tokens": CONTEXT, "max_output_tokens": 4096, "litellm_provider": "openai", "mode": "chat"}}))
    with AgentProxy(node.url, "-", {}) as proxy:
        env = {"OPENAI_API_BASE": f"{proxy.url}/v1", "OPENAI_API_KEY": "unused", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
               "AIDER_ANALYTICS": "false", "AIDER_CHECK_UPDATE": "false"}
        result, took = run([str(aider), "--model", model, "--message", "What does notes.txt say?", "notes.txt",
                            "--no-git", "--no-check-update", "--analytics-disable", "--no-show-release-notes",
                            "--no-show-model-warnings", "--no-pretty", "--no-fancy-input", "--no-stream", "--yes-always",
                            "--no-auto-commits", "--no-gitignore", "--edit-format", "ask"], home, project, env)
        print(f"aider --message: {took:.1f} s, {len(proxy.requests)} requests")
        assert result.returncode == 0, report(result, proxy)
        chats = proxy.bodies("/v1/chat/completions")
        assert chats and SECRET in json.dumps(chats[-1]["messages"]), report(result, proxy)  # the file went in the prompt
        assert result.stdout.strip(), report(result, proxy)
        assert proxy.answers and all(status == 200 for status, _ in proxy.answers), report(result, proxy)
