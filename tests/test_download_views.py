"""Shards fetched from peers as the API and CLI show them (docs/models.md): the instance view's
figures per rank, the place bar's downloading phase with bytes and speed, the instances table's
text bar, the previews' bytes to fetch."""

from __future__ import annotations

import io

from rich.console import Console

from exo_p2p.cli.output.readable import download_text
from exo_p2p.cli.output.render import instance_progress, previews_table, shard_line
from exo_p2p.cli.placement.waiting import download_figures, instance_phase, wait_until_ready

MIB = 1 << 20


def _shard(status: str, **kw) -> dict:
    return {"rank": 0, "node_id": "n1", "start_layer": 0, "end_layer": 4, "status": status, **kw}


def _downloading(done: int) -> dict:
    return {"instance_id": "i1", "model": "m", "status": "loading", "layers_loaded": 0, "layers_total": 8,
            "shards": [_shard("idle"), _shard("downloading", bytes_done=done, bytes_total=8 * MIB,
                                              bytes_per_second=2.0 * MIB)]}


def test_instances_show_a_download_bar_with_bytes_and_speed() -> None:
    assert instance_progress(_downloading(2 * MIB)) == \
        "downloading [##--------] 25% 2.0 MiB/8.0 MiB at 2.0 MiB/s"
    assert download_text(0, 0, 0.0).startswith("downloading [----------] 0%")
    assert shard_line(_shard("downloading", bytes_done=MIB, bytes_total=4 * MIB)).endswith("downloading 1.0 MiB/4.0 MiB")
    assert instance_progress({"status": "loading", "layers_total": 8, "layers_loaded": 2,
                              "shards": [_shard("loading")]}) == "loading 2/8 layers"


def test_a_download_says_how_much_came_from_peers_and_from_the_hub() -> None:
    inst = _downloading(3 * MIB)
    inst["shards"][1].update(bytes_from_peers=MIB, bytes_from_hub=2 * MIB)
    assert instance_progress(inst).endswith("at 2.0 MiB/s (1.0 MiB from peers, 2.0 MiB from the hub)")
    assert shard_line(inst["shards"][1]).endswith("downloading 3.0 MiB/8.0 MiB (1.0 MiB from peers, 2.0 MiB from the hub)")
    assert download_figures(inst) == (3 * MIB, 8 * MIB, 2.0 * MIB, MIB, 2 * MIB)
    inst["shards"][1].update(bytes_from_peers=0)
    assert instance_progress(inst).endswith("(2.0 MiB from the hub)")
    from types import SimpleNamespace

    from exo_p2p.cli.placement.waiting import _Amount

    task = SimpleNamespace(completed=3 * MIB, total=8 * MIB,  # the place bar's task while shards download
                           fields={"unit": "bytes", "speed": 2.0 * MIB, "from_peers": 0, "from_hub": 2 * MIB})
    assert _Amount().render(task).plain == "3.0 MiB/8.0 MiB 2.0 MiB/s (2.0 MiB from the hub)"


def test_place_waits_through_the_downloading_phase() -> None:
    states = iter([_downloading(4 * MIB), _downloading(8 * MIB),
                   {**_downloading(0), "shards": [_shard("loading"), _shard("loading")], "layers_loaded": 4},
                   {**_downloading(0), "status": "ready", "shards": [_shard("ready"), _shard("ready")]}])

    class Client:
        def instance(self, instance_id: str) -> dict:
            return next(states)

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=120)
    final = wait_until_ready(Client(), _downloading(0), timeout=30, console=console, sleep=lambda s: None)
    assert final["status"] == "ready"
    phases = [line.split(": ", 1)[1] for line in out.getvalue().splitlines() if line.startswith("m: ")]
    assert phases == ["downloading shards", "loading layers", "ready"]
    assert instance_phase(_downloading(0)) == "downloading shards"
    assert download_figures(_downloading(3 * MIB)) == (3 * MIB, 8 * MIB, 2.0 * MIB, 0, 0)
    assert download_figures({"shards": [_shard("loading")]}) is None


def test_previews_say_what_each_node_fetches() -> None:
    preview = {"sharding": "pipeline", "world_size": 2, "nodes": ["a", "b"], "layers": [4, 4],
               "bytes": [1 << 30, 1 << 30], "fetch_bytes": [0, 3 * MIB], "error": None}
    out = io.StringIO()
    Console(file=out, width=200).print(previews_table("m", [preview]))
    text = out.getvalue()
    assert "fetches 3.0 MiB from peers" in text and text.count("fetches") == 1
    hub = {**preview, "fetch_bytes": [4 * MIB, 3 * MIB], "fetch_from_peers": [0, MIB], "fetch_from_hub": [4 * MIB, 2 * MIB]}
    out = io.StringIO()
    Console(file=out, width=200).print(previews_table("m", [hub]))
    text = out.getvalue()
    assert "fetches 4.0 MiB from the hub" in text
    assert "fetches 3.0 MiB (1.0 MiB from peers, 2.0 MiB from the hub)" in text


def test_instance_view_carries_each_downloading_rank_and_the_sums() -> None:
    from exo_p2p.api.views import instance_out
    from exo_p2p.state.views import instance_view
    from exo_p2p.types import Instance, RunnerDownloading, RunnerIdle, RunnerRecord, ShardMetadata, State

    shards = tuple(ShardMetadata(f"n{r}", f"i-r{r}", r, 3, 2 * r, 2 * r + 2, 6, 100, "boot") for r in range(3))
    inst = Instance("i", "m", "pipeline", shards)
    runners = {"i-r0": RunnerRecord("i-r0", "i", "n0", RunnerIdle()),
               "i-r1": RunnerRecord("i-r1", "i", "n1", RunnerDownloading(3, 10, 1.5, 1, 2)),
               "i-r2": RunnerRecord("i-r2", "i", "n2", RunnerDownloading(5, 20, 2.5, 0, 5))}
    view = instance_view(State(instances={"i": inst}, runners=runners), inst)
    assert view.status == "loading" and view.downloads == (None, RunnerDownloading(3, 10, 1.5, 1, 2),
                                                           RunnerDownloading(5, 20, 2.5, 0, 5))
    out = instance_out(view)
    assert (out.bytes_downloaded, out.bytes_to_download, out.bytes_from_peers, out.bytes_from_hub) == (8, 30, 1, 7)
    assert [(s.bytes_from_peers, s.bytes_from_hub) for s in out.shards] == [(None, None), (1, 2), (0, 5)]
    assert [(s.status, s.bytes_done, s.bytes_total) for s in out.shards] == [
        ("idle", None, None), ("downloading", 3, 10), ("downloading", 5, 20)]
