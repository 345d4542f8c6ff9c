"""Placement: where an instance's ranks run (docs/architecture.md#rules "Memory rule",
"Link cost"). ``place`` is the entry (``place_instance``, ``placement_previews``); the
request's context in ``context``, its search in ``search`` over the cycle search
(``topology``, ``cycle_order``, ``cycle_search``, ``branch_and_bound``,
``completion_bound``, ``cycle_sweep``) and the link cost model (``cost``); shares in
``split``, memory in ``memory``, fetching nodes in ``fetch``, ring addresses in
``ring``, failure messages in ``explain``. Imports nothing itself."""
