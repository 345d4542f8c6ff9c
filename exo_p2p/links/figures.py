"""Link figures: quantising a measurement and deciding when it is worth an event (docs/links.md).

Pure rules. A node measures every address of every peer (``exo_p2p.links.prober``); what it
measures is noisy, and every published figure is an event in the replicated log, so:

- figures are **quantised** to two significant digits (``quantise``: 1234 µs → 1200 µs), so a
  figure in State never claims more precision than a median of a few probes has;
- a new figure is **published** only when it differs from the one in State by more than a
  stated fraction (``moved``): RTT by more than ``RTT_MOVE`` (50 %) *and* more than
  ``RTT_FLOOR_US`` (loopback and LAN RTTs of 50–300 µs jitter by ±100 % under load, which
  no placement decision depends on), bandwidth by more than ``BANDWIDTH_MOVE`` (30 %);
- bandwidth is re-measured rarely (``BANDWIDTH_EVERY``), and at once when an address appears
  or its RTT moved (``bandwidth_due``).

A steady cluster of N nodes thus adds no ``LinkMeasured`` after the first round, whatever N;
each change of a link costs one event of ~150 bytes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from exo_p2p.types import LinkFigures
RTT_MOVE = 0.5
"""Fraction by which a quantised RTT must move to be published again."""
RTT_FLOOR_US = 500
"""Microseconds by which an RTT must move, at least, to be published again."""
BANDWIDTH_MOVE = 0.3
"""Fraction by which a quantised bandwidth must move to be published again."""
RTT_EVERY = 15.0
"""Seconds between two RTT measurements of one address (a few small probes)."""
BANDWIDTH_EVERY = 600.0
"""Seconds between two bandwidth measurements of one address when its RTT holds."""
PROBES = 5
"""Small probes per RTT measurement (their median is the RTT)."""
PROBE_BYTES = 64
"""Bytes of one RTT probe (and of its echo)."""
BANDWIDTH_BYTES = 4 << 20
"""Bytes of one bandwidth transfer at most (4 MiB: ~0.3 s at 100 Mbit/s)."""
BANDWIDTH_SECONDS = 2.0
"""Seconds one bandwidth transfer may take at most; a slower link is timed on what arrived."""


def quantise(value: float) -> int:
    """``value`` (≥ 0) rounded to two significant digits, as an int (0 stays 0, at least 1 otherwise)."""
    if value <= 0:
        return 0
    digits = max(0, int(math.floor(math.log10(value))) - 1)
    step = 10**digits
    return max(1, int(round(value / step)) * step)


def median_rtt_us(samples_s: Sequence[float]) -> int:
    """The quantised median of round trips given in seconds, in microseconds.

    Raises ``ValueError`` when ``samples_s`` is empty."""
    if not samples_s:
        raise ValueError("no RTT samples")
    return quantise(statistics.median(samples_s) * 1e6)


def throughput(nbytes: int, seconds: float) -> int:
    """Quantised bytes per second of ``nbytes`` moved in ``seconds`` (> 0)."""
    return quantise(nbytes / max(seconds, 1e-6))


def rtt_moved(old: int, new: int) -> bool:
    """True when RTT ``new`` (µs) differs from ``old`` by more than ``RTT_MOVE`` of ``old`` and
    more than ``RTT_FLOOR_US``."""
    delta = abs(new - old)
    return delta > RTT_MOVE * old and delta > RTT_FLOOR_US


def bandwidth_moved(old: int | None, new: int | None) -> bool:
    """True when bandwidth ``new`` (bytes/s) is news against ``old``: first measured, or moved by
    more than ``BANDWIDTH_MOVE`` of ``old``. None (not measured) is never news."""
    if new is None:
        return False
    if old is None:
        return True
    return abs(new - old) > BANDWIDTH_MOVE * old


def moved(old: LinkFigures | None, new: LinkFigures) -> bool:
    """True when ``new`` must be published: no figure in State yet, another interface type, or
    the RTT or the bandwidth moved by more than its fraction (module docstring)."""
    if old is None:
        return True
    return (
        old.interface_type != new.interface_type
        or rtt_moved(old.rtt_us, new.rtt_us)
        or bandwidth_moved(old.bytes_per_s, new.bytes_per_s)
    )


def bandwidth_due(*, last_rtt_us: int | None, rtt_us: int, measured_at: float | None, now: float) -> bool:
    """True when an address's bandwidth must be measured now: never measured, its RTT moved
    (``rtt_moved`` against the RTT at that measurement), or ``BANDWIDTH_EVERY`` s have passed."""
    if measured_at is None or last_rtt_us is None:
        return True
    return rtt_moved(last_rtt_us, rtt_us) or now - measured_at >= BANDWIDTH_EVERY
