"""``exo-p2p top``: a live terminal view of the cluster as one node sees it, redrawn every
``--interval`` seconds until Ctrl-C (``--once``: one frame and exit).

It reads the node's ``GET /state`` (nodes, instances, the tasks in flight on each) and
``GET /metrics`` (this node's runners and API), and shows: the master, term and log index;
each node's memory and runners; each instance's status, nodes, sequences running and
queued against its batch limit, and tokens per second — measured by the runners of this
node, else from the completions this node's API delivered (an instance whose requests all
come through other nodes shows ``-``). docs/operations.md.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from exo_p2p.cli.common import ApiKeyOpt, ApiOpt, app, client_for, handled, stdout_console

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_metrics(text: str) -> Samples:
    """Every sample of a Prometheus text exposition by (name, sorted labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def tokens_by_instance(samples: Samples) -> dict[str, float]:
    """Tokens per instance so far: the runners' generated tokens where this node hosts rank 0,
    else the completion tokens its API delivered."""
    out: dict[str, float] = {}
    for (name, labels), v in samples.items():
        d = dict(labels)
        if name == "exo_completion_tokens_total" and d.get("instance"):
            out[d["instance"]] = out.get(d["instance"], 0.0) + v
    for (name, labels), v in samples.items():
        d = dict(labels)
        if name == "exo_runner_generated_tokens_total" and d.get("rank") == "0":
            out[d["instance"]] = v
    return out


@dataclass
class Rates:
    """Tokens per second per instance between two frames."""

    last: dict[str, float]
    at: float

    def update(self, now: dict[str, float], at: float) -> dict[str, float]:
        dt = at - self.at
        rates = {k: max(0.0, v - self.last.get(k, v)) / dt for k, v in now.items()} if dt > 0 else {}
        self.last, self.at = now, at
        return rates


def _gib(n: object) -> str:
    return "-" if not isinstance(n, (int, float)) else f"{n / 2**30:.1f}"


def _status(state: Mapping, inst: Mapping) -> str:
    if inst.get("failed_reason"):
        return "failed"
    runners = state.get("runners", {})
    kinds = [runners.get(s["runner_id"], {}).get("status", {}).get("kind") for s in inst.get("shards", [])]
    return "ready" if kinds and all(k in ("ready", "running") for k in kinds) else "loading"


def frame(state: Mapping, samples: Samples, rates: Mapping[str, float]) -> Group:
    """One frame of ``top`` from ``GET /state``, this node's metrics and the rates."""
    nodes = state.get("nodes", {})
    names = {nid: (p.get("friendly_name") or nid[:8]) for nid, p in nodes.items()}
    master = state.get("master")
    flight = samples.get(("exo_requests_in_flight", ()), 0)
    head = Text(f"master {names.get(master, master or '-')}  term {state.get('term')}  log {state.get('last_event_idx')}  "
                f"this node: {names.get(state.get('node_id'), '-')}, {flight:.0f} requests in flight")
    node_table = Table(title="nodes", title_justify="left")
    for col in ("node", "id", "master", "mem free GiB", "mem total GiB", "runners"):
        node_table.add_column(col)
    runners = state.get("runners", {})
    for nid, p in sorted(nodes.items()):
        count = sum(1 for r in runners.values() if r.get("node_id") == nid)
        node_table.add_row(names[nid], nid[:8], "*" if nid == master else "", _gib(p.get("memory_available")),
                           _gib(p.get("memory_total")), str(count))
    tasks = list(state.get("tasks", {}).values())
    inst_table = Table(title="instances", title_justify="left")
    for col in ("instance", "model", "status", "nodes", "running", "queued", "batch", "tok/s"):
        inst_table.add_column(col)
    for iid, inst in sorted(state.get("instances", {}).items()):
        mine = [t for t in tasks if t["task"]["instance_id"] == iid]
        running = sum(1 for t in mine if t.get("status") == "running")
        queued = sum(1 for t in mine if t.get("status") == "pending")
        limit = (inst.get("settings") or {}).get("max_batch", 1)
        where = ", ".join(names.get(s["node_id"], s["node_id"][:8]) for s in inst.get("shards", []))
        rate = rates.get(iid)
        inst_table.add_row(iid[:8], inst.get("model_id", ""), _status(state, inst), where, str(running), str(queued),
                           f"{min(running, limit)}/{limit}", "-" if rate is None else f"{rate:.1f}")
    return Group(head, node_table, inst_table)


@app.command()
@handled
def top(
    ctx: typer.Context,
    interval: Annotated[float, typer.Option("--interval", min=0.2, max=60, help="Seconds between two frames.")] = 1.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """A live view of the cluster: nodes, instances, sequences running and queued, batch, tok/s."""
    with client_for(ctx, api, api_key) as client:
        def read() -> tuple[Mapping, Samples]:
            metrics = client.text("/metrics")
            return client.state(), parse_metrics(metrics) if metrics is not None else {}

        state, samples = read()
        rates = Rates(tokens_by_instance(samples), time.monotonic())
        if once:
            stdout_console().print(frame(state, samples, {}))
            return
        with Live(frame(state, samples, {}), console=stdout_console(), auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                state, samples = read()
                live.update(frame(state, samples, rates.update(tokens_by_instance(samples), time.monotonic())),
                            refresh=True)
