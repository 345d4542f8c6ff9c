"""Model aliases: names clients send (``claude-sonnet-4-5``, ``gpt-4o``) mapped to models the
cluster serves (docs/models.md "Aliases"). Pure.

An alias is ``NAME=MODEL`` (``--alias``, repeatable, or ``alias = ["NAME=MODEL", ...]`` in
config.toml); ``NAME`` may be a glob (``*``, ``?``, ``[...]``, as ``fnmatch``): ``claude-*``.
Each node publishes its own in its profile (``NodeProfile.aliases``), so every node's API
resolves the same names (``cluster_aliases``). Resolution (``resolve``): a name the cluster
holds a model of is never an alias; else the first alias whose ``NAME`` is the name exactly,
else the first glob that matches, in the order: this node's, then the other nodes' by node id;
a target that is itself an alias is followed, at most ``MAX_HOPS`` times.

Refused at start (``check_aliases``, ``ValueError`` naming ``--alias``): text that is not
``NAME=MODEL``, an empty side, more than ``MAX_ALIASES`` or longer than ``MAX_ALIAS_CHARS``,
a target that is a glob, and a loop (an alias whose chain comes back to itself).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from fnmatch import fnmatchcase

import msgspec

from exo_p2p.types import ModelCard, State
from exo_p2p.types.topology import MAX_ALIAS_CHARS, MAX_ALIASES

MAX_HOPS = 8
"""Aliases followed at most from one name (a chain across nodes' aliases cannot loop forever)."""
_GLOB = set("*?[")


def is_glob(name: str) -> bool:
    """Whether ``name`` is a pattern (has ``*``, ``?`` or ``[``)."""
    return any(c in _GLOB for c in name)


def parse_alias(text: str) -> tuple[str, str]:
    """``(NAME, MODEL)`` of ``NAME=MODEL``; raises ``ValueError`` naming ``--alias``."""
    if len(text) > MAX_ALIAS_CHARS:
        raise ValueError(f"--alias {text[:40]!r}...: longer than {MAX_ALIAS_CHARS} characters")
    name, sep, model = text.partition("=")
    name, model = name.strip(), model.strip()
    if not sep or not name:
        raise ValueError(f"--alias {text!r}: expected NAME=MODEL, e.g. 'claude-*=smollm2-135m-instruct'")
    if not model:
        raise ValueError(f"--alias {text!r}: the alias {name!r} names no model (NAME=MODEL)")
    if is_glob(model):
        raise ValueError(f"--alias {text!r}: the model {model!r} is a pattern; only the alias NAME may be one")
    return name, model


def matcher(pairs: Sequence[tuple[str, str]]) -> Callable[[str], str | None]:
    """The one-step lookup over ``pairs``: exact names first, then globs, in order."""
    exact: dict[str, str] = {}
    for name, model in pairs:
        if not is_glob(name):
            exact.setdefault(name, model)
    globs = [(name, model) for name, model in pairs if is_glob(name)]

    def step(name: str) -> str | None:
        if name in exact:
            return exact[name]
        return next((model for pattern, model in globs if fnmatchcase(name, pattern)), None)

    return step


def check_aliases(texts: Iterable[str]) -> list[str]:
    """``texts`` checked (``NAME=MODEL`` each, at most ``MAX_ALIASES``, no loop); returns them
    as given. Raises ``ValueError`` naming ``--alias`` and the loop when there is one."""
    items = list(texts)
    if len(items) > MAX_ALIASES:
        raise ValueError(f"--alias given {len(items)} times; at most {MAX_ALIASES}")
    pairs = [parse_alias(t) for t in items]
    step = matcher(pairs)
    for name, model in pairs:
        chain = [name, model]
        while (following := step(chain[-1])) is not None:
            if following in chain or len(chain) > MAX_HOPS:
                raise ValueError(f"--alias loop: {' -> '.join([*chain, following])}; an alias must end at a model")
            chain.append(following)
    return items


def cluster_aliases(state: State, own: str) -> list[tuple[str, str]]:
    """The aliases every node of ``state`` publishes, ``own`` node's first, then by node id;
    entries that do not parse are skipped (a node checks its own at start)."""
    order = sorted(state.nodes, key=lambda n: (n != own, n))
    out: list[tuple[str, str]] = []
    for node_id in order:
        for text in state.nodes[node_id].aliases[:MAX_ALIASES]:
            try:
                out.append(parse_alias(text))
            except ValueError:
                continue
    return out


def resolve(name: str, pairs: Sequence[tuple[str, str]], known: Callable[[str], bool]) -> str:
    """The model ``name`` stands for: itself when ``known(name)`` or no alias matches, else the
    end of its alias chain (at most ``MAX_HOPS`` steps)."""
    step = matcher(pairs)
    current = name
    for _ in range(MAX_HOPS):
        if known(current):
            return current
        following = step(current)
        if following is None or following == current:
            return current
        current = following
    return current


def listed(state: State, own: str) -> list[tuple[str, str]]:
    """``(alias, model)`` for ``/v1/models`` and ``/api/tags``: each alias (a glob listed as
    its pattern) whose chain ends at a model the cluster holds and that is not itself a model."""
    pairs = cluster_aliases(state, own)
    cards = state.model_cards
    seen: dict[str, str] = {}
    for name, model in pairs:
        if name in cards or name in seen:
            continue
        target = resolve(model, pairs, cards.__contains__)
        if target in cards:
            seen[name] = target
    return sorted(seen.items())


def alias_cards(state: State, own: str) -> list[ModelCard]:
    """The cards to list for the cluster's aliases (``listed``): the target's card under the
    alias's name, so ``/v1/models`` and ``/api/tags`` show what a client may send."""
    return [msgspec.structs.replace(state.model_cards[model], model_id=name) for name, model in listed(state, own)]
