"""scripts/burners.py, the load of scripts/busy_recipe.py: ``count`` busy processes in one
process group, in a session of their own by default (another session: another Linux
autogroup) or in the caller's; stopping them leaves none behind. Real processes, ~1 s."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "burners.py"
_spec = importlib.util.spec_from_file_location("burners", _PATH)
burners = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(burners)  # type: ignore[union-attr]


def _group(pgid: int) -> list[tuple[int, int]]:
    """(pid, session id) of the live (not zombie) processes in process group ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append((int(entry.name), int(fields[3])))
    return out


def _wait_for(predicate, seconds: float = 5.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("same_session", [False, True])
def test_burners_share_one_group_in_the_session_asked_and_stop_entirely(same_session):
    group = burners.start_burners(3, same_session=same_session)
    try:
        members = _wait_for(lambda: _group(group.pid) if len(_group(group.pid)) == 3 else None)
        assert members and len(members) == 3, members
        sessions = {sid for _, sid in members}
        assert len(sessions) == 1
        assert (sessions == {os.getsid(0)}) == same_session
    finally:
        burners.stop_burners(group)
    assert _wait_for(lambda: _group(group.pid) == []), _group(group.pid)


def test_no_burners_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        burners.start_burners(0)
