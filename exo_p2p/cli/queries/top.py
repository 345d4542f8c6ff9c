"""``exo-p2p top``: a live terminal view of the cluster as one node sees it, redrawn every
``--interval`` seconds until Ctrl-C (``--once``: one frame and exit).

It reads the node's ``GET /state`` (nodes, instances, the tasks in flight on each) and
``GET /metrics`` (this node's runners and API), and shows: the master, term and log index;
each node's memory and runners; each instance's status, nodes, sequences running and
queued against its batch limit, and tokens per second — measured by the runners of this
node, else from the completions this node's API delivered (an instance whose requests all
come through other nodes shows ``-``); while none flow, the speed of its last request
through this node (``GET /requests``), marked "last"; and the share of drafted tokens its
runners accepted (speculative decoding). docs/operations.md.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from exo_p2p.cli.common import ApiKeyOpt, ApiOpt, app, client_for, handled, stdout_console
from exo_p2p.cli.node_api.client import NodeClient
from exo_p2p.cli.errors import ApiError
from exo_p2p.cli.output.fit import fit
from exo_p2p.cli.output.readable import NODE_ID_CHARS, node_labels, short_ids

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


def acceptance_by_instance(samples: Samples) -> dict[str, str]:
    """Instance id → its drafted tokens' acceptance so far (accepted ÷ proposed, as a
    percentage) from the runners of this node hosting its rank 0; instances that drafted
    nothing are left out (speculative decoding, docs/architecture.md#speculative-decoding)."""
    counts: dict[str, list[float]] = {}
    for (name, labels), v in samples.items():
        d = dict(labels)
        for i, metric in enumerate(("exo_runner_draft_proposed_tokens_total", "exo_runner_draft_accepted_tokens_total")):
            if name == metric and d.get("rank") == "0" and d.get("instance"):
                counts.setdefault(d["instance"], [0.0, 0.0])[i] = v
    return {iid: f"{100 * a / p:.0f}%" for iid, (p, a) in counts.items() if p > 0}


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


def last_rates(records: list[Mapping]) -> dict[str, float]:
    """Instance id → the decode tok/s of its newest finished request (``GET /requests``
    records, oldest first), for the instances that served one with a measured speed."""
    out: dict[str, float] = {}
    for r in records:
        if r.get("instance") and isinstance(r.get("decode_tps"), (int, float)):
            out[str(r["instance"])] = float(r["decode_tps"])
    return out


def rate_text(live: float | None, last: float | None) -> str:
    """The tok/s cell: the rate between two frames while tokens flow, else the speed of the
    instance's last request on this node (``"12.3 last"``), else ``-``."""
    if live:
        return f"{live:.1f}"
    if last:
        return f"{last:.1f} last"
    return "-" if live is None else "0.0"


def _gib(n: object) -> str:
    return "-" if not isinstance(n, (int, float)) else f"{n / 2**30:.1f}"


def _status(state: Mapping, inst: Mapping) -> str:
    if inst.get("failed_reason"):
        return "failed"
    runners = state.get("runners", {})
    kinds = [runners.get(s["runner_id"], {}).get("status", {}).get("kind") for s in inst.get("shards", [])]
    return "ready" if kinds and all(k in ("ready", "running") for k in kinds) else "loading"


def frame(state: Mapping, samples: Samples, rates: Mapping[str, float],
          last: Mapping[str, float] | None = None, width: int = 80) -> Group:
    """One frame of ``top`` ``width`` characters wide (``exo_p2p.cli.output.fit``) from ``GET /state``,
    this node's metrics, the rates between two frames and the last requests' speeds
    (``last_rates``)."""
    nodes = state.get("nodes", {})
    names = node_labels({nid: str(p.get("friendly_name") or "") for nid, p in nodes.items()})
    ids = short_ids(list(nodes), NODE_ID_CHARS)
    master = state.get("master")
    flight = samples.get(("exo_requests_in_flight", ()), 0)
    head = Text(f"master {names.get(master, master or '-')}  term {state.get('term')}  log {state.get('last_event_idx')}  "
                f"this node: {names.get(state.get('node_id'), '-')}, {flight:.0f} requests in flight")
    node_table = Table(title="nodes", title_justify="left")
    for col in ("node", "id", "master", "free GiB", "total GiB", "runners"):
        node_table.add_column(col, overflow="fold")
    runners = state.get("runners", {})
    for nid, p in sorted(nodes.items()):
        count = sum(1 for r in runners.values() if r.get("node_id") == nid)
        node_table.add_row(names[nid], ids[nid], "*" if nid == master else "", _gib(p.get("memory_available")),
                           _gib(p.get("memory_total")), str(count))
    tasks = list(state.get("tasks", {}).values())
    inst_table = Table(title="instances", title_justify="left")
    for col in ("instance", "model", "status", "nodes", "running", "queued", "batch", "tok/s", "drafts"):
        inst_table.add_column(col)
    accepted = acceptance_by_instance(samples)
    for iid, inst in sorted(state.get("instances", {}).items()):
        mine = [t for t in tasks if t["task"]["instance_id"] == iid]
        running = sum(1 for t in mine if t.get("status") == "running")
        queued = sum(1 for t in mine if t.get("status") == "pending")
        limit = (inst.get("settings") or {}).get("max_batch", 1)
        where = ", ".join(names.get(s["node_id"], s["node_id"]) for s in inst.get("shards", []))
        inst_table.add_row(iid[:8], inst.get("model_id", ""), _status(state, inst), where, str(running), str(queued),
                           f"{min(running, limit)}/{limit}", rate_text(rates.get(iid), (last or {}).get(iid)),
                           accepted.get(iid, "-"))
    return Group(head, fit(node_table, width), fit(inst_table, width))


@app.command()
@handled
def top(
    ctx: typer.Context,
    interval: Annotated[float, typer.Option("--interval", min=0.2, max=60, help="Seconds between two frames.")] = 1.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame (its rates measured over --interval) and exit.")] = False,
    api: ApiOpt = None,
    api_key: ApiKeyOpt = None,
) -> None:
    """A live view of the cluster: nodes, instances, sequences running and queued, batch, tok/s
    (while tokens flow; else the speed of the instance's last request here, marked "last")."""
    with client_for(ctx, api, api_key) as client:
        speeds = LastSpeeds()

        def read() -> tuple[Mapping, Samples]:
            metrics = client.text("/metrics")
            speeds.read(client)
            return client.state(), parse_metrics(metrics) if metrics is not None else {}

        state, samples = read()
        rates = Rates(tokens_by_instance(samples), time.monotonic())
        if once:
            time.sleep(interval)
            state, samples = read()
            live_rates = rates.update(tokens_by_instance(samples), time.monotonic())
            console = stdout_console()
            console.print(frame(state, samples, live_rates, speeds.by_instance, console.width))
            return
        console = stdout_console()
        with Live(frame(state, samples, {}, speeds.by_instance, console.width), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                state, samples = read()
                live.update(frame(state, samples, rates.update(tokens_by_instance(samples), time.monotonic()),
                                  speeds.by_instance, console.width), refresh=True)


@dataclass
class LastSpeeds:
    """The decode speed of each instance's last request on this node, kept up to date from
    ``GET /requests`` (only the records after the last one read; none when records are off
    or the key may not read them)."""

    by_instance: dict[str, float] = field(default_factory=dict)
    after: int = 0

    def read(self, client: NodeClient) -> None:
        try:
            answer = client.request("GET", "/requests", params={"after": self.after})
        except ApiError:
            return
        self.by_instance.update(last_rates(answer.get("records") or []))
        self.after = int(answer.get("last", self.after))
