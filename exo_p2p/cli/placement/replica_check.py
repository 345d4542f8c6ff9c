"""``place``'s replica check (pure; docs/cli.md): which instances of a model count as existing.

Placing a model that already has an instance would add a replica (its memory again), so
``place`` does not, unless ``--replica`` says so: it says which instances the model has and
waits for one of them instead, like a placement of its own (never a question: a prompt
would eat the next lines of a pasted block, and a refusal would stop a script). An instance counts when it is not failed (ready, loading,
warming up), and also when it failed but the master will re-place it (not given up): a
cluster restarted with its data dirs re-places the instances of its previous run a moment
after it starts, and a placement made meanwhile would double them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def counted_instances(model: str, listed: Sequence[Mapping], state_instances: Mapping[str, Mapping]) -> list[Mapping]:
    """The instances of ``model`` that count as existing for the replica check.

    ``listed``: the ``GET /instances`` entries (``instance_id``, ``model``, ``status``);
    ``state_instances``: ``GET /state``'s ``instances`` (id -> instance, with ``gave_up``),
    needed only for failed ones. A failed instance counts when State holds it and it is not
    given up (the master re-places it); one State does not list is not counted."""
    out = []
    for inst in listed:
        if inst.get("model") != model:
            continue
        if inst.get("status") != "failed" or replacing(inst, state_instances):
            out.append(inst)
    return out


def replacing(inst: Mapping, state_instances: Mapping[str, Mapping]) -> bool:
    """Whether the listed instance ``inst`` is failed and will be re-placed by the master
    (its State record is there and not given up)."""
    record = state_instances.get(str(inst.get("instance_id")))
    return inst.get("status") == "failed" and record is not None and not record.get("gave_up", False)


def replica_notice(model: str, counted: Sequence[Mapping], short: Mapping[str, str],
                   state_instances: Mapping[str, Mapping]) -> str:
    """What ``place`` says instead of adding a replica of ``model``: how many instances it
    has (``counted``, named by ``short`` id -> short id), how many of them are being
    re-placed, and that ``--replica`` adds one, taking the memory again."""
    n = len(counted)
    ids = ", ".join(short.get(str(i["instance_id"]), str(i["instance_id"])) for i in counted)
    coming = sum(1 for i in counted if replacing(i, state_instances))
    if coming == 0:
        being = ""
    elif coming == n:
        being = ", being re-placed" if n == 1 else ", all being re-placed"
    else:
        being = f", {coming} of them being re-placed"
    return (f"{model} already has {n} instance{'s' if n > 1 else ''} ({ids}){being}; "
            "not placing another (--replica adds a replica, using its memory again)")
