"""Fixtures of the dashboard's browser tests: one headless chromium per test module (Debian's
``chromium`` package driven by Playwright; ``scripts/install.sh --test`` installs it), a fresh page
(own storage) per test."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("EXO_P2P_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture(scope="module")
def browser(request):
    """Chromium with ``CHROMIUM_ARGS`` and the test module's ``CHROMIUM_EXTRA_ARGS`` (a list of
    launch args, e.g. ``--host-resolver-rules=...``), if it has any."""
    if not CHROMIUM.exists():
        # scripts/install.sh --test installs it wherever it can (root with apt): there a missing
        # browser is a broken set-up, not a reason to skip.
        if os.geteuid() == 0 and shutil.which("apt-get"):
            pytest.fail(f"no chromium at {CHROMIUM}: run scripts/install.sh --test (it installs Debian's package)")
        pytest.skip(f"no chromium at {CHROMIUM} (install Debian's chromium package as root)")
    from playwright import sync_api
    with sync_api.sync_playwright() as p:
        extra = list(getattr(request.module, "CHROMIUM_EXTRA_ARGS", ()))
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, *extra])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.js_errors = errors  # type: ignore[attr-defined]
    try:
        yield pg
    finally:
        context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
