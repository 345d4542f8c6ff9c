"""How placement is put together (docs/architecture.md#layers, "Memory rule"): one package,
its context a frozen record of the request and one ``Search`` per request, the cycle search
and the cost model in it, and ``exo_p2p/state/`` free of both."""

from __future__ import annotations

import dataclasses
import functools
import runpy
from pathlib import Path

import pytest

from master.placement import place, search
from master.placement.context import placement_context
from master.placement.place import place_instance, placement_previews
from tests.support.rules.placement_clusters import clusters

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def project_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, function-local imports counted (the changed
    lane's reader, ``scripts/changed_tests.py``)."""
    return runpy.run_path(str(ROOT / "scripts" / "changed_tests.py"))["import_graph"](ROOT)


def _graph() -> dict[str, set[str]]:
    graph = project_graph()
    inside = {m for m in graph if m.startswith("master.placement.")}
    return {m: graph[m] & inside for m in inside}


def test_the_package_has_no_import_circle_and_the_context_imports_no_search() -> None:
    graph = _graph()
    assert graph["master.placement.context"].isdisjoint(
        {"master.placement.search", "master.placement.explain", "master.placement.place", "master.placement.cycle_search",
         "master.placement.branch_and_bound", "master.placement.cycle_sweep"})
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"import circle: {' -> '.join((*path, node))}"
        if node not in done:
            for nxt in sorted(graph[node]):
                visit(nxt, (*path, node))
            done.add(node)

    for module in sorted(graph):
        visit(module, ())


def test_state_imports_nothing_of_links_or_placement() -> None:
    graph = project_graph()
    bad = [(m, i) for m, imports in sorted(graph.items()) if m.startswith("exo_p2p.state") for i in sorted(imports)
           if i.startswith(("exo_p2p.links", "master"))]
    assert bad == []
    assert any(m.startswith("exo_p2p.state.") for m in graph)


def test_the_context_is_a_frozen_record_without_search_state() -> None:
    cluster = next(c for c in clusters(40, 3) if len(c.state.nodes) > 2 and not c.required)
    ctx = placement_context(cluster.state, cluster.card, ())
    fields = {f.name for f in dataclasses.fields(ctx)}
    assert fields == {"state", "card", "required", "eligible", "excluded", "hosts", "topology", "exact", "blocking", "fetchers"}
    before = dataclasses.replace(ctx, excluded=dict(ctx.excluded))
    found = search.Search(ctx)
    for sharding in ("pipeline", "tensor"):
        for size in range(1, len(ctx.eligible) + 1):
            found.best_of_size(sharding, size)
    found.largest_candidate(list(range(1, len(ctx.eligible) + 1)))
    assert ctx == before
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.exact = not ctx.exact  # type: ignore[misc]


def test_one_search_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[search.Search] = []
    real = search.Search

    def counted(ctx, *rest):
        made.append(real(ctx, *rest))
        return made[-1]

    monkeypatch.setattr(place, "Search", counted)
    cluster = next(c for c in clusters(40, 3) if len(c.state.nodes) > 2 and not c.required)
    placement_previews(cluster.state, cluster.card)
    assert len(made) == 1
    for sharding in ("pipeline", "tensor"):
        try:
            place_instance(cluster.state, cluster.card, sharding=sharding)
        except place.PlacementError:
            pass
    assert len(made) == 3 and len({id(s) for s in made}) == 3
