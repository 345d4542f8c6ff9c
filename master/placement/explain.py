"""Why a placement fails, in numbers: the message of ``PlacementError`` and of a failed preview.

``explain`` names, in order of precedence, the world sizes the model cannot be split over,
no candidate cycle at all, not enough memory on the largest candidate cycle (needed vs
offered, GiB and bytes), a node of it without the disk for the bytes it must fetch, or the
first rank whose share does not fit; then every node left out and why, and every pair of
nodes without a ring address.
"""

from __future__ import annotations

from exo_p2p.types import Sharding
from master.placement.context import gib, label, required_bytes, size_problem
from master.placement.search import Search, disk_short, rank_shares, weight_policies
from master.placement.split import Overflow


def explain(search: Search, sharding: Sharding, min_size: int, sizes: list[int]) -> str:
    """Why no cycle of ``sizes`` nodes takes the model under ``sharding`` (sizes already tried
    and failed by ``search``, the request's search; ``min_size``: the smallest size asked for,
    named when there is no candidate)."""
    ctx = search.ctx
    state, card = ctx.state, ctx.card
    ok_sizes = [k for k in sizes if size_problem(card, sharding, k) is None]
    if sizes and not ok_sizes:
        message = "; ".join(dict.fromkeys(p for k in sizes if (p := size_problem(card, sharding, k))))
    else:
        largest = search.largest_candidate(ok_sizes)
        need = required_bytes(card.storage_size)
        if largest is None:
            containing = f" containing {', '.join(label(state, n) for n in sorted(ctx.required))}" if ctx.required else ""
            message = (
                f"no candidate cycle of {min_size} or more nodes{containing} among the "
                f"{len(ctx.eligible)} nodes that report memory and hold (or can fetch) model {card.model_id}"
            )
        else:
            total, cycle, usable = largest
            names = ", ".join(label(state, n) for n in cycle)
            if total < need:
                message = (
                    f"needs {gib(need)} ({need} bytes: {gib(card.storage_size)} + 10%); "
                    f"the largest candidate cycle ({names}) has {gib(total)} ({total} bytes)"
                )
            else:
                over = rank_shares(card, sharding, usable, weight_policies(state, cycle))
                disk = None if isinstance(over, Overflow) else disk_short(ctx, sharding, cycle, over)
                if disk is not None:
                    rank, fetch, need, have = disk
                    message = (
                        f"no candidate cycle has the disk for the shards it must fetch; on the largest "
                        f"candidate cycle ({names}) rank {rank} on {label(state, cycle[rank])} would fetch "
                        f"{gib(fetch)} ({fetch} bytes) and needs {need} bytes free in its models dir "
                        f"but has {have} bytes"
                    )
                else:
                    assert isinstance(over, Overflow)
                    message = (
                        f"no candidate cycle holds every rank's share; on the largest candidate cycle ({names}) "
                        f"rank {over.rank} on {label(state, cycle[over.rank])} needs {gib(over.need)} "
                        f"({over.need} bytes) but has {gib(over.have)} ({over.have} bytes)"
                    )
    notes = [f"{label(state, n)}: {why}" for n, why in ctx.excluded.items()]
    notes += [f"no ring address from {label(state, a)} to {label(state, b)}" for a, b in ctx.topology.unaddressed]
    return message + "".join(f"; {note}" for note in notes)
