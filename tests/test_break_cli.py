"""A careless user against the CLI: malformed ``--api`` URLs end in one line and exit 2,
never a traceback (no node needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from exo_p2p.cli.node_api.endpoint import normalize_api_url
from exo_p2p.cli.errors import CliError

BAD_URLS = ["http://[::1", "http://127.0.0.1:99999", "http://256.1.1.1:5", "http://x:abc", "http://:5"]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_malformed_api_url_is_a_cli_error(url: str) -> None:
    with pytest.raises(CliError) as err:
        normalize_api_url(url)
    assert err.value.exit_code == 2 and "--api" in str(err.value)


def test_good_api_urls_pass() -> None:
    assert normalize_api_url("127.0.0.1:52515/") == "http://127.0.0.1:52515"
    assert normalize_api_url("http://[::1]:8000") == "http://[::1]:8000"
    assert normalize_api_url("https://node.lan") == "https://node.lan"


@pytest.mark.integration
def test_a_malformed_api_url_prints_one_line() -> None:
    """``exo-p2p nodes --api http://[::1`` used to end in a ValueError traceback."""
    for url in ("http://[::1", "http://256.1.1.1:5"):
        out = subprocess.run([sys.executable, "-m", "exo_p2p", "nodes", "--api", url],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out
        assert "Traceback" not in out.stderr and out.stderr.strip().count("\n") == 0, out.stderr


@pytest.fixture()
def json_service():
    """Some other HTTP service answering every request with 200 and JSON ``"hello"``."""
    from http.server import BaseHTTPRequestHandler

    from tests.support.net.http_stub import serving

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = b'"hello"'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args) -> None:
            pass

    with serving(Handler) as url:
        yield url


@pytest.mark.integration
def test_an_api_url_of_another_json_service_is_a_one_line_error(json_service: str) -> None:
    """Commands used to end in ``AttributeError: 'str' object has no attribute 'get'``."""
    for command in (["nodes"], ["rm", "tiny"]):
        out = subprocess.run([sys.executable, "-m", "exo_p2p", *command, "--api", json_service],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 1, out
        assert "Traceback" not in out.stderr and out.stderr.strip().count("\n") == 0, out.stderr
        assert "does not understand" in out.stderr
