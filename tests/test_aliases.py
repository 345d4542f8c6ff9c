"""Model aliases (pure): ``exo_p2p.api.demand.aliases`` and the ``--alias`` check
(docs/models.md "Aliases")."""

from __future__ import annotations

import msgspec
import pytest

from exo_p2p.api.demand.aliases import alias_cards, check_aliases, cluster_aliases, listed, parse_alias, resolve
from exo_p2p.settings import checks
from exo_p2p.types import NodeProfile
from tests.support.rules.master_run import one_node
from tests.support.rules.strategies import CARD


def test_parse_and_bad_shapes_name_the_flag():
    assert parse_alias("claude-*=smollm") == ("claude-*", "smollm")
    for bad in ("claude", "=m", "claude-*=", "a=m*", "x" * 300 + "=m"):
        with pytest.raises(ValueError, match="--alias"):
            parse_alias(bad)


def test_loops_are_refused_at_start_chains_are_not():
    assert check_aliases(["a=b", "b=m"]) == ["a=b", "b=m"]
    with pytest.raises(ValueError, match=r"--alias loop: a -> b -> a"):
        checks.aliases(["a=b", "b=a"])
    with pytest.raises(ValueError, match="loop"):
        check_aliases(["gpt-*=gpt-x"])  # the glob matches its own target
    with pytest.raises(ValueError, match="at most 64"):
        check_aliases([f"a{i}=m" for i in range(65)])


def test_resolution_exact_before_glob_models_never_shadowed_and_chains_followed():
    pairs = [("claude-*", "m"), ("claude-opus", "big"), ("big", "m2"), ("gpt-*", "m")]
    known = {"m", "m2", "gpt-real"}.__contains__
    assert resolve("claude-sonnet-4-5", pairs, known) == "m"
    assert resolve("claude-opus", pairs, known) == "m2"  # exact first, then big -> m2
    assert resolve("gpt-real", pairs, known) == "gpt-real"  # a model of that name wins
    assert resolve("other", pairs, known) == "other"  # 404 later, under the name sent


def test_aliases_are_read_from_every_nodes_profile_own_first_and_listed():
    s = one_node()
    own = "node-a"
    other = NodeProfile("node-b", "boot-2", "b", aliases=("claude-*=zzz", "gpt-4o=m"))
    nodes = {**s.nodes, own: msgspec.structs.replace(s.nodes[own], aliases=("claude-*=m", "bad")), "node-b": other}
    s = msgspec.structs.replace(s, nodes=nodes)
    assert cluster_aliases(s, own) == [("claude-*", "m"), ("claude-*", "zzz"), ("gpt-4o", "m")]
    assert listed(s, own) == [("claude-*", "m"), ("gpt-4o", "m")]
    cards = alias_cards(s, own)
    assert [c.model_id for c in cards] == ["claude-*", "gpt-4o"] and cards[0].n_layers == CARD.n_layers


def test_alias_and_keep_alive_from_flags_and_config_toml_and_bad_ones_refused_at_start(monkeypatch, tmp_path):
    """``--alias`` and ``--keep-alive`` as the node command reads them (the node never starts)."""
    from typer.testing import CliRunner

    from exo_p2p.cli.cluster import commands as cluster_cmds
    from exo_p2p.cli.main import app

    started: list = []
    monkeypatch.setattr(cluster_cmds, "run_node", started.append)

    def node(*args: str):
        return CliRunner().invoke(app, ["node", "--data-dir", str(tmp_path), *args], env={"EXO_P2P_API": None, "COLUMNS": "200"})

    assert node("--alias", "claude-*=m", "--keep-alive", "10m").exit_code == 0
    assert started[-1].aliases == ["claude-*=m"] and started[-1].keep_alive == 600.0
    (tmp_path / "config.toml").write_text('alias = ["gpt-*=m"]\nkeep-alive = "-1"\n')
    assert node().exit_code == 0
    assert started[-1].aliases == ["gpt-*=m"] and started[-1].keep_alive == -1.0
    (tmp_path / "config.toml").unlink()
    for bad, words in ((["--alias", "a=b", "--alias", "b=a"], "--alias loop"), (["--alias", "claude-*="], "--alias"),
                       (["--keep-alive", "soon"], "keep-alive")):
        result = node(*bad)
        assert result.exit_code == 2 and words in result.stderr, (bad, result.stderr)
    assert len(started) == 2
