"""The tier check of ``tests/tiers.py``, run on small test files of its own (pytester).

These tests start the inner tests' processes in this process's name, so they are
``integration`` themselves."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

CONFTEST = "from tests.tiers import *  # noqa: F401,F403\n"

INNER = '''
import socket
import subprocess

import pytest


@pytest.fixture(scope="module")
def a_node():
    subprocess.run(["true"], check=True)  # stands for NodeProcess(...).start()


def test_unmarked_starts_a_process():
    subprocess.run(["true"], check=True)


def test_unmarked_hides_the_start():
    try:
        subprocess.run(["true"], check=True)
    except Exception:
        pass  # a retry loop that swallows errors cannot hide the start


def test_unmarked_binds_a_socket():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))


def test_unmarked_socketpair_is_fine():
    a, b = socket.socketpair()
    a.close()
    b.close()


def test_unmarked_pure_rule():
    assert sorted([3, 1, 2]) == [1, 2, 3]


@pytest.mark.integration
def test_marked_starts_a_process():
    subprocess.run(["true"], check=True)


@pytest.mark.integration
def test_integration_enters_a_namespace():
    subprocess.run(["ip", "netns", "exec", "nowhere", "true"])

'''

MODULE_FIXTURE = '''
import subprocess

import pytest


@pytest.fixture(scope="module")
def a_node():
    subprocess.run(["true"], check=True)  # stands for NodeProcess(...).start()
    yield


def test_uses_a_node(a_node):
    pass
'''


INNER_E2E = """
import subprocess

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.e2e
def test_e2e_enters_a_namespace():
    try:
        subprocess.run(["ip", "netns", "list"], capture_output=True)
    except FileNotFoundError:
        pass  # no iproute2: the start was allowed, which is what is checked
"""


def _outcomes(pytester: pytest.Pytester, source: str) -> tuple[dict[str, str], str]:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=source)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rA")
    text = result.stdout.str()
    outcomes = {}
    for line in text.splitlines():
        for word in ("PASSED", "FAILED", "ERROR"):
            if line.startswith(word + " "):
                test = line.split()[1].split("::")[-1]
                outcomes[test] = word
    return outcomes, text


def test_unmarked_tests_that_start_processes_or_sockets_fail(pytester: pytest.Pytester) -> None:
    outcomes, text = _outcomes(pytester, INNER)
    assert outcomes == {
        "test_unmarked_starts_a_process": "FAILED",
        "test_unmarked_hides_the_start": "FAILED",
        "test_unmarked_binds_a_socket": "FAILED",
        "test_unmarked_socketpair_is_fine": "PASSED",
        "test_unmarked_pure_rule": "PASSED",
        "test_marked_starts_a_process": "PASSED",
        "test_integration_enters_a_namespace": "FAILED",
    }, text
    assert "is a unit test but its call started a process (true): mark it @pytest.mark.integration" in text
    assert "used a network socket (bind ('127.0.0.1', 0))" in text
    assert "is a integration test but its call started a browser or entered a network namespace" in text


def test_a_module_fixture_that_starts_a_node_fails_the_unmarked_test_that_set_it_up(
    pytester: pytest.Pytester,
) -> None:
    outcomes, text = _outcomes(pytester, MODULE_FIXTURE)
    assert outcomes == {"test_uses_a_node": "ERROR"}, text
    assert "is a unit test but its setup started a process" in text


def test_two_tier_markers_are_refused_at_collection(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_inner="import pytest\n\n@pytest.mark.unit\n@pytest.mark.e2e\ndef test_both():\n    pass\n"
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret != 0
    assert "one tier marker, not ['e2e', 'unit']" in result.stdout.str() + result.stderr.str()


def test_unmarked_tests_are_selected_by_minus_m_unit(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_inner="import pytest\n\ndef test_a():\n    pass\n\n@pytest.mark.integration\ndef test_b():\n    pass\n"
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-m", "unit")
    result.assert_outcomes(passed=1, deselected=1)


@pytest.mark.e2e
def test_a_tests_own_e2e_marker_overrides_its_modules_and_may_enter_a_namespace(
    pytester: pytest.Pytester,
) -> None:
    outcomes, text = _outcomes(pytester, INNER_E2E)
    assert outcomes == {"test_e2e_enters_a_namespace": "PASSED"}, text


@pytest.mark.unit
def test_only_browsers_and_namespace_commands_are_e2e() -> None:
    from tests.tiers import is_e2e_command

    assert is_e2e_command(["ip", "netns", "exec", "ns1", "python", "-m", "exo_p2p", "node"])
    assert is_e2e_command(["/usr/sbin/ip", "-n", "ns1", "link", "set", "lo", "up"])
    assert is_e2e_command(["/usr/bin/chromium", "--headless"])
    assert is_e2e_command(["/x/site-packages/playwright/driver/node", "cli.js"])
    # a node whose data dir happens to be named after a namespace test is not
    assert not is_e2e_command(["python", "-m", "exo_p2p", "node", "--data-dir", "/tmp/test_netns_heal0/a"])
    assert not is_e2e_command(["ip", "link", "show"])
    assert not is_e2e_command([])
