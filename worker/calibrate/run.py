"""Running the calibration (``worker.calibrate.measure``) from the node: a subprocess, its
answer parsed, bounded and quantised, and when to measure again (docs/placement-speed.md).

- at start, once; then every ``IDLE_EVERY`` s while the node hosts no busy runner (``idle``),
  so a calibration never competes with a runner's work and costs ~1.5 s of CPU per 10 min;
- a figure that does not parse, or is outside ``master``'s bounds (``SPEED_BOUNDS``, repeated
  here: ``worker`` never imports ``master``), is dropped and logged; the last good one stays;
- figures are quantised to two significant digits (``exo_p2p.links.figures.quantise``) and a
  new speed replaces the published one only when a figure moved by more than ``SPEED_MOVE``,
  so a steady node publishes no new profile.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping

import msgspec
import structlog
import trio

from exo_p2p.links.figures import quantise
from exo_p2p.types import NodeSpeed

log = structlog.get_logger("exo_p2p.node")

TIMEOUT_S = 30.0
"""Seconds a calibration subprocess may take (MLX's import on a loaded machine included)."""
IDLE_EVERY = 600.0
"""Seconds between two calibrations of an idle node."""
SPEED_MOVE = 0.3
"""Fraction by which a figure must move for a new speed to be published."""
BOUNDS = (1, 10_000_000)
"""Accepted range of each figure (``master.placement.speed_split.SPEED_BOUNDS``)."""
MAX_OUTPUT = 4096
"""Bytes of the subprocess's answer read at most."""


def parse_speed(text: str) -> NodeSpeed:
    """The ``NodeSpeed`` of the subprocess's answer (one JSON object), quantised.

    Raises ``ValueError`` when it does not parse or a figure is not an int within ``BOUNDS``."""
    try:
        raw = msgspec.json.decode(text.strip()[:MAX_OUTPUT].encode())
        speed = msgspec.convert(raw, NodeSpeed)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"calibration answer does not parse: {exc}") from None
    figures = msgspec.structs.asdict(speed)
    for name, value in figures.items():
        if not BOUNDS[0] <= value <= BOUNDS[1]:
            raise ValueError(f"calibration figure {name}={value} outside {BOUNDS}")
    return NodeSpeed(**{name: quantise(value) for name, value in figures.items()})


def speed_moved(old: NodeSpeed | None, new: NodeSpeed) -> bool:
    """True when ``new`` must replace ``old``: none yet, or a figure moved by more than ``SPEED_MOVE``."""
    if old is None:
        return True
    pairs = zip(msgspec.structs.astuple(old), msgspec.structs.astuple(new), strict=True)
    return any(abs(b - a) > SPEED_MOVE * a for a, b in pairs)


def calibrate_once(env: Mapping[str, str] | None = None) -> NodeSpeed:
    """Run ``worker.calibrate.measure`` in a subprocess with ``env`` (the runners' environment:
    the same BLAS threads) and return its figures. Raises ``ValueError`` when it fails, times
    out or answers nonsense."""
    try:
        out = subprocess.run([sys.executable, "-m", "worker.calibrate.measure"], capture_output=True, text=True,
                             timeout=TIMEOUT_S, env=dict(env) if env is not None else None, check=False)
    except subprocess.TimeoutExpired:
        raise ValueError(f"calibration took over {TIMEOUT_S:.0f} s") from None
    if out.returncode != 0:
        raise ValueError(f"calibration exited {out.returncode}: {out.stderr[-300:]}")
    return parse_speed(out.stdout)


class Calibration:
    """This node's speed: ``speed`` is what its profile publishes (None until measured)."""

    def __init__(self, env: Mapping[str, str] | None = None, measure: Callable[[], NodeSpeed] | None = None) -> None:
        self.speed: NodeSpeed | None = None
        self._measure = measure or (lambda: calibrate_once(env))

    async def measure(self) -> None:
        """One calibration in a thread; a failure is logged and keeps the last speed."""
        try:
            new = await trio.to_thread.run_sync(self._measure, abandon_on_cancel=True)
        except ValueError as exc:
            log.warning("speed calibration dropped", reason=str(exc))
            return
        if speed_moved(self.speed, new):
            log.info("speed calibrated", **msgspec.structs.asdict(new))
            self.speed = new

    async def run(self, idle: Callable[[], bool], every: float = IDLE_EVERY) -> None:
        """Calibrate now, then every ``every`` s when ``idle()``. Never returns."""
        await self.measure()
        while True:
            await trio.sleep(every)
            if idle():
                await self.measure()
