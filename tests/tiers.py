"""The suite's tiers, and the check that keeps every test in the right one (docs/testing.md).

Every test belongs to exactly one tier, named by its marker:

- ``unit`` — pure rules and property tests: no process, no network socket. The default:
  a test with no tier marker is ``unit``. ``pytest -m unit`` is the fast lane.
- ``integration`` — real processes (nodes, runners, rank processes, a CLI run as a
  subprocess) or sockets on loopback.
- ``e2e`` — the embedded model, a browser, or network namespaces (the slowest tests).

The check, for each test while its setup, call and teardown run (module fixtures a test
sets up are counted against the test that set them up):

- a ``unit`` test that starts a process (``subprocess``, ``multiprocessing``, ``os.fork``,
  ``os.posix_spawn``, ``os.system``) or binds, listens on or connects an IPv4/IPv6 socket
  fails, naming what it started; the start itself raises ``TierViolation`` so nothing runs;
- an ``integration`` test that starts a browser (Playwright's driver or chromium) or
  enters a network namespace (``ip netns``) fails: that is ``e2e``;
- a test with two tier markers on one level fails at collection (a test's own marker
  overrides its module's).

A violation is recorded even when the code under test catches the exception, so a retry
loop cannot hide it. ``socketpair`` (trio's and asyncio's wake-up pipes) and Unix-domain
sockets are not network sockets and are allowed everywhere.
"""

from __future__ import annotations

import _posixsubprocess
import os
import shlex
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

TIERS = ("unit", "integration", "e2e")
"""The tier markers, fastest first."""
BROWSERS = frozenset({"chromium", "chromium-browser", "chrome", "headless_shell"})
"""Program names that make a test ``e2e`` (Playwright's driver is recognised by its path)."""
LIBRARY_LOOKUPS = frozenset({"ldconfig", "gcc", "cc", "ld", "objdump"})
"""Commands ``ctypes.util.find_library`` runs when a library is imported lazily (trio and
ifaddr do on import): a lookup, not a process the test starts — allowed in every tier."""
_INET = (socket.AF_INET, socket.AF_INET6)


class TierViolation(Exception):
    """Raised where a test does what its tier forbids (a process or socket in a unit test)."""


def tier_of(item: pytest.Item) -> str:
    """The tier of ``item``: its nearest tier marker (a test's own marker wins over its
    class's, which wins over the module's ``pytestmark``), ``unit`` when it has none.

    Raises ``pytest.UsageError`` naming the test when one level carries two tier markers."""
    node: pytest.Item | pytest.Collector | None = item
    while node is not None:
        own = list(dict.fromkeys(m.name for m in node.own_markers if m.name in TIERS))
        if len(own) > 1:
            raise pytest.UsageError(f"{item.nodeid}: one tier marker, not {own} (tests/tiers.py)")
        if own:
            return own[0]
        node = node.parent
    return "unit"


def pytest_configure(config: pytest.Config) -> None:
    for name, text in (
        ("unit", "pure rules and property tests: no process, no network socket (the default)"),
        ("integration", "real processes or sockets on loopback"),
        ("e2e", "the embedded model, a browser, or network namespaces"),
    ):
        config.addinivalue_line("markers", f"{name}: {text} (tests/tiers.py)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test without a tier marker ``unit``, so ``-m unit`` selects it."""
    for item in items:
        if tier_of(item) == "unit" and item.get_closest_marker("unit") is None:
            item.add_marker(pytest.mark.unit)


def _argv(args: object) -> list[str]:
    """A started command as a list of words (``os.system``'s string is split like a shell)."""
    if isinstance(args, (list, tuple)):
        return [os.fsdecode(a) if isinstance(a, (bytes, str)) else str(a) for a in args]
    return shlex.split(os.fsdecode(args) if isinstance(args, (bytes, str)) else str(args))


def is_e2e_command(argv: list[str]) -> bool:
    """Whether ``argv`` starts a browser or enters a network namespace (``ip netns ...``,
    ``ip -n NAME ...``): what only an ``e2e`` test may do."""
    if not argv:
        return False
    program = os.path.basename(argv[0])
    if program in BROWSERS or "playwright" in argv[0].split(os.sep):
        return True
    return program == "ip" and any(word in ("netns", "-n", "-netns") for word in argv[1:3])


def _process_judge(tier: str, found: list[str]) -> Callable[[object], None]:
    """A callback for a process about to start: records and raises what ``tier`` forbids."""

    def judge(args: object) -> None:
        argv = _argv(args)
        if argv and os.path.basename(argv[0]) in LIBRARY_LOOKUPS:
            return
        command = " ".join(argv)[:160]
        if tier == "unit":
            message = f"started a process ({command})"
        elif tier == "integration" and is_e2e_command(argv):
            message = f"started a browser or entered a network namespace ({command})"
        else:
            return
        found.append(message)
        raise TierViolation(message)

    return judge


def _socket_judge(found: list[str]) -> Callable[[socket.socket, str, object], None]:
    def judge(sock: socket.socket, verb: str, address: object) -> None:
        if sock.family in _INET:
            message = f"used a network socket ({verb} {address!r})"
            found.append(message)
            raise TierViolation(message)

    return judge


@contextmanager
def _guarded(tier: str, found: list[str]) -> Iterator[None]:
    """Patches process starts (every tier but e2e) and inet sockets (unit only) for a phase."""
    if tier == "e2e":
        yield
        return
    judge = _process_judge(tier, found)
    mp = pytest.MonkeyPatch()
    real_fork_exec = _posixsubprocess.fork_exec

    def fork_exec(args, executables, *rest):  # type: ignore[no-untyped-def]
        judge(args)
        return real_fork_exec(args, executables, *rest)

    mp.setattr(_posixsubprocess, "fork_exec", fork_exec)  # multiprocessing's spawn
    if getattr(subprocess, "_fork_exec", None) is not None:  # subprocess keeps its own name
        mp.setattr(subprocess, "_fork_exec", fork_exec)
    for name in ("posix_spawn", "posix_spawnp", "system"):
        mp.setattr(os, name, _judged(getattr(os, name), judge))
    if tier == "unit":
        real_fork = os.fork

        def fork() -> int:
            judge(["os.fork()"])
            return real_fork()

        mp.setattr(os, "fork", fork)
        _patch_sockets(mp, _socket_judge(found))
    try:
        yield
    finally:
        mp.undo()


def _judged(real: Callable, judge: Callable[[object], None]) -> Callable:  # type: ignore[type-arg]
    """``real`` (``os.system``, ``os.posix_spawn``: the command is the last positional
    argument before any keyword) with ``judge`` called on its command line first."""

    def start(*args, **kwargs):  # type: ignore[no-untyped-def]
        judge(args[1] if len(args) > 1 else args[0])
        return real(*args, **kwargs)

    return start


def _patch_sockets(mp: pytest.MonkeyPatch, judge: Callable[[socket.socket, str, object], None]) -> None:
    for verb in ("bind", "connect", "connect_ex"):
        real = getattr(socket.socket, verb)

        def patched(self, address, _real=real, _verb=verb):  # type: ignore[no-untyped-def]
            judge(self, _verb, address)
            return _real(self, address)

        mp.setattr(socket.socket, verb, patched)
    real_listen = socket.socket.listen

    def listen(self, *backlog):  # type: ignore[no-untyped-def]
        judge(self, "listen", backlog)
        return real_listen(self, *backlog)

    mp.setattr(socket.socket, "listen", listen)


def _phase(item: pytest.Item, phase: str) -> Iterator[None]:
    """One phase of ``item`` under its tier's guard; a violation fails it, whatever the
    phase raised or returned (a caught ``TierViolation`` still counts)."""
    tier = tier_of(item)
    found: list[str] = []
    error: BaseException | None = None
    with _guarded(tier, found):
        try:
            result = yield
        except BaseException as e:  # noqa: BLE001 - re-raised below, or replaced by the violation
            error = e
    if found:
        wanted = "integration" if tier == "unit" else "e2e"
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise pytest.fail.Exception(
            f"{item.nodeid} is a {tier} test but its {phase} {found[0]}{more}: "
            f"mark it @pytest.mark.{wanted} (tests/tiers.py)",
            pytrace=False,
        ) from error
    if error is not None:
        raise error
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _phase(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _phase(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    return (yield from _phase(item, "teardown"))
