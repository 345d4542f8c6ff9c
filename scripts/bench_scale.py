"""The control plane at 16, 64, 128 and 256 members: a table of the scale figures
(docs/cluster.md, "Many machines").

Each N runs in its own process (``--one N``, JSON out): N real cluster members (election,
heartbeats, log replication, sequencing, State apply, placement) over the in-memory transport
of ``tests/support/scale`` (the libp2p layer replaced at its interface), on trio's MockClock
with autojump: times are protocol time, as if each member had its own machine; CPU is measured
per member with a trio instrument. Per N, in order:

- ``form``: cold start until every member follows one master and lists every member;
  ``mesh``: until every State holds the full mesh of topology edges;
- ``rest``: messages and kB per node per second (sent + received payload) over 10 s of rest,
  the followers' mean and the master's;
- ``state``: the master's State as msgpack (kB); ``place``: CPU ms of one placement of a 32-layer
  card on at least 2/4/8 nodes (median of 3, on the formed State);
- ``seq``: events/s the master can sequence (500 events, one per ``emit``, by its own CPU),
  and the CPU µs one follower spends per event;
- ``lag``: p50/p99 ms from the master's emit to each follower's apply at 100 events/s for 2 s;
- ``failover``: the master killed, until every live member follows a new master whose term
  every State holds.

    python scripts/bench_scale.py [--sizes 16,64,128,256] [--latency 0.001] [--loss 0] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import structlog  # noqa: E402
import trio  # noqa: E402
import trio.testing  # noqa: E402

from tests.support.scale.cluster import ScaleCluster  # noqa: E402
from tests.support.scale.cpu import CpuMeter  # noqa: E402
from tests.support.scale.measure import at_rest, failover, master_node, placement_ms, replication_lag, sequencing, state_size  # noqa: E402
from tests.support.scale.memnet import Fabric  # noqa: E402

COLUMNS = ("N", "form s", "mesh s", "failover s", "seq ev/s", "fol µs/ev", "lag p50 ms", "lag p99 ms",
           "rest msg/s fol", "rest msg/s master", "rest kB/s fol", "rest kB/s master", "State kB", "place 2/4/8 ms",
           "wall s", "CPU s")


async def measure(n: int, root: Path, latency: float, loss: float, seed: int) -> dict:
    """Every figure for one cluster of ``n`` members (module docstring), as a dict."""
    meter = CpuMeter()
    trio.lowlevel.add_instrument(meter)
    cluster = ScaleCluster(n, root, Fabric(latency=latency, jitter=latency / 2, loss=loss, seed=seed), meter=meter)
    out: dict = {"N": n}
    async with trio.open_nursery() as nursery:
        await cluster.start(nursery)
        out["form"] = await cluster.wait_for(cluster.formed, 120)
        out["mesh"] = out["form"] + await cluster.wait_for(cluster.meshed, 300, poll=0.25)
        await trio.sleep(3)  # the last edges' acknowledgements settle
        rest = await at_rest(cluster, 10.0)
        out["rest"] = [rest.msgs_follower, rest.bytes_follower, rest.msgs_master, rest.bytes_master]
        out["state"] = state_size(cluster)
        state = master_node(cluster).state
        out["place"] = [placement_ms(state, cluster.card, k) for k in (2, 4, 8) if k <= n]
        seq = await sequencing(cluster, meter, 500)
        out["seq"] = [seq.events_per_s, seq.follower_us, seq.fabric_us]
        p50, p99, _ = await replication_lag(cluster, 100.0, 2.0)
        out["lag"] = [p50, p99]
        out["failover"] = (await failover(cluster, 60))[0]
        nursery.cancel_scope.cancel()
    return out


def one(n: int, latency: float, loss: float, seed: int) -> dict:
    """Run ``measure`` for ``n`` members in this process (data dirs on tmpfs when there is one)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    start, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory(dir=shm, prefix="bench-scale-") as d:
        out = trio.run(measure, n, Path(d), latency, loss, seed, clock=trio.testing.MockClock(autojump_threshold=0))
    out["wall"], out["cpu"] = time.perf_counter() - start, time.process_time() - cpu
    return out


def row(r: dict) -> list[str]:
    """The table row of one result."""
    rest = r["rest"]
    return [str(r["N"]), f"{r['form']:.2f}", f"{r['mesh']:.2f}", f"{r['failover']:.2f}", f"{r['seq'][0]:,.0f}",
            f"{r['seq'][1]:.0f}", f"{r['lag'][0] * 1000:.1f}", f"{r['lag'][1] * 1000:.1f}",
            f"{rest[0]:.0f}", f"{rest[2]:.0f}", f"{rest[1] / 1000:.1f}", f"{rest[3] / 1000:.1f}", f"{r['state'] / 1000:,.0f}",
            "/".join(f"{p:.0f}" for p in r["place"]), f"{r['wall']:.0f}", f"{r['cpu']:.0f}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="16,64,128,256", help="member counts, comma-separated")
    ap.add_argument("--latency", type=float, default=0.001, help="one-way latency, seconds (jitter: half of it)")
    ap.add_argument("--loss", type=float, default=0.0, help="probability a gossip copy or a stream packet is lost")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.latency, args.loss, args.seed)))
        return
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) < 2:
        ap.error("--sizes takes member counts of at least 2")
    print(f"load average before: {os.getloadavg()}; latency {args.latency * 1000:.1f} ms, loss {args.loss}", flush=True)
    results = []
    for n in sizes:
        cmd = [sys.executable, __file__, "--one", str(n), "--latency", str(args.latency), "--loss", str(args.loss),
               "--seed", str(args.seed)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"N={n} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
            continue
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"  N={n}: done in {results[-1]['wall']:.0f} s wall, {results[-1]['cpu']:.0f} s CPU; load {os.getloadavg()}",
              " | ".join(row(results[-1])), flush=True)
    table = [list(COLUMNS)] + [row(r) for r in results]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    for line in table:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(line, widths)) + " |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
