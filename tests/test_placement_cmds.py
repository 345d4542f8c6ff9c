"""``place``'s line once placed and ``delete``'s resolution of an instance id prefix
(``exo_p2p.cli.placement.commands``): pure, no node."""

from __future__ import annotations

import pytest

from exo_p2p.cli.errors import ApiError, CliError
from exo_p2p.cli.placement.commands import full_instance_id, placed_line

LISTED = [
    {"instance_id": "abc123", "model": "smollm2-135m-instruct"},
    {"instance_id": "abd456", "model": "smollm2-135m-instruct"},
    {"instance_id": "fff000", "model": "qwen"},
]
NOT_FOUND = ApiError("no instance abc", 404)


def test_placed_line_names_the_sharding_and_the_nodes():
    inst = {"instance_id": "i1", "model": "m", "sharding": "tensor", "shards": [{}, {}]}
    assert placed_line("asked", inst) == "placed m as instance i1 (tensor, 2 nodes)"


def test_placed_line_defaults_to_the_asked_model_and_pipeline():
    assert placed_line("asked", {"instance_id": "i1", "shards": [{}]}) == "placed asked as instance i1 (pipeline, 1 node)"
    assert placed_line("asked", {"instance_id": "i1"}) == "placed asked as instance i1 (pipeline, 0 nodes)"


def test_a_unique_prefix_names_its_instance():
    assert full_instance_id("abc", LISTED, NOT_FOUND) == "abc123"
    assert full_instance_id("f", LISTED, NOT_FOUND) == "fff000"


def test_an_ambiguous_prefix_lists_the_matches():
    with pytest.raises(CliError) as err:
        full_instance_id("ab", LISTED, NOT_FOUND)
    assert err.value.exit_code == 1
    assert err.value.message == "instance prefix 'ab' is ambiguous: it matches abc123, abd456"


def test_a_model_name_points_at_stop():
    with pytest.raises(CliError) as err:
        full_instance_id("qwen", LISTED, NOT_FOUND)
    assert "`exo-p2p stop qwen`" in err.value.message


def test_no_match_keeps_the_nodes_message():
    with pytest.raises(CliError) as err:
        full_instance_id("zzz", LISTED, NOT_FOUND)
    assert err.value.message == "no instance abc (`exo-p2p instances` lists the ids)"
