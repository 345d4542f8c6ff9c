"""The family rule (exo_p2p/models/card/families.py) and where it shows: placement refuses a split
a family cannot take, with the reason in its previews (never at load); a model's card carries
its quantization; ``GET /models`` and ``exo-p2p models`` show family, quantization and the
allowed shardings. The synthetic family models the matrix test uses load as their family.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.models.card.families import (
    MATRIX,
    NO_MLX_SHARD,
    NO_PIPELINE,
    UNTESTED,
    quantization_of,
    sharding_problem,
    shardings_of,
)
from tests.support.models.synthetic_families import FAMILIES
from master.placement.place import PlacementError, place_instance, placement_previews
from tests.support.rules.placement_cluster import GIB, card, cluster


def test_the_matrix_covers_every_synthetic_family() -> None:
    assert set(MATRIX) == set(FAMILIES)
    assert not set(MATRIX) & set(NO_PIPELINE)


@pytest.mark.parametrize("family", list(MATRIX))
def test_a_tested_family_allows_what_the_matrix_says(family: str) -> None:
    allowed, notes = shardings_of(family)
    assert "pipeline" in allowed and "pipeline" not in notes
    if MATRIX[family].tensor is None:
        assert "tensor" in allowed and not notes
    else:
        assert "tensor" not in allowed and MATRIX[family].tensor in notes["tensor"]


@given(st.one_of(st.sampled_from(sorted(MATRIX) + sorted(NO_PIPELINE)), st.text(max_size=12)), st.booleans())
def test_every_sharding_is_allowed_or_explained(family: str, supports_tensor: bool) -> None:
    """Each sharding is either allowed or has its reason, never both; tensor needs mlx-lm's
    shard; a pipeline is refused only for the families whose layers share state."""
    allowed, notes = shardings_of(family, supports_tensor=supports_tensor)
    for sharding in ("pipeline", "tensor"):
        problem = sharding_problem(family, sharding, supports_tensor=supports_tensor)
        assert (sharding in allowed) == (problem is None)
        assert problem is None or notes[sharding] == problem
    assert ("pipeline" in allowed) == (family not in NO_PIPELINE)
    assert supports_tensor or "tensor" not in allowed


def test_families_outside_the_matrix() -> None:
    assert shardings_of("starcoder2") == (["pipeline", "tensor"], {"pipeline": UNTESTED, "tensor": UNTESTED})
    allowed, notes = shardings_of("starcoder2", supports_tensor=False)
    assert allowed == ["pipeline"] and NO_MLX_SHARD in notes["tensor"]
    allowed, notes = shardings_of("gemma3n", supports_tensor=False)
    assert allowed == [] and "reuse earlier layers' KV caches" in notes["pipeline"]
    with pytest.raises(ValueError, match="unknown sharding"):
        sharding_problem("llama", "ring")


@pytest.mark.parametrize(("config", "want"), [
    ({"quantization": {"group_size": 64, "bits": 4}}, "4-bit, group 64"),
    ({"quantization": {"group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}}},
     "4-bit, group 32, some modules 8-bit"),
    ({"quantization_config": {"bits": 8}}, "8-bit"),
    ({"torch_dtype": "bfloat16"}, "bfloat16"),
    ({"text_config": {"torch_dtype": "float16"}}, "float16"),
    ({}, "unquantized"),
])
def test_quantization_of(config: dict, want: str) -> None:
    assert quantization_of(config) == want


def _family_card(family: str, *, supports_tensor: bool = True):
    return msgspec.structs.replace(card(4, 4 * GIB // 8, heads=4, kv=2), architecture=family,
                                   supports_tensor=supports_tensor)


def test_placement_refuses_a_split_the_family_cannot_take_and_previews_say_why() -> None:
    state = cluster([(8 * GIB, 8 * GIB)] * 2)
    gemma = _family_card("gemma3n", supports_tensor=False)
    with pytest.raises(PlacementError, match="gemma3n layers cannot be split"):
        place_instance(state, gemma, min_nodes=2)
    assert len(place_instance(state, gemma, min_nodes=1).shards) == 1  # one node needs no split
    previews = {(p.sharding, p.world_size): p for p in placement_previews(state, gemma)}
    assert previews[("pipeline", 1)].error is None
    assert "reuse earlier layers' KV caches" in previews[("pipeline", 2)].error
    assert NO_MLX_SHARD in previews[("tensor", 2)].error

    phi = _family_card("phi3", supports_tensor=False)
    previews = {(p.sharding, p.world_size): p for p in placement_previews(state, phi)}
    assert previews[("pipeline", 2)].error is None
    assert NO_MLX_SHARD in previews[("tensor", 2)].error
    with pytest.raises(PlacementError, match="mlx-lm has no tensor sharding"):
        place_instance(state, phi, min_nodes=2, sharding="tensor")


@pytest.mark.parametrize("family", [f for f in MATRIX if MATRIX[f].tensor is None])
def test_placement_splits_the_families_the_matrix_proves(family: str) -> None:
    state = cluster([(8 * GIB, 8 * GIB)] * 2)
    for sharding in ("pipeline", "tensor"):
        assert len(place_instance(state, _family_card(family), min_nodes=2, sharding=sharding).shards) == 2


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_synthetic_family_model_loads_as_its_family(tmp_path, family: str) -> None:
    """mlx-lm builds the family's own class from the written files (strict: every parameter
    present, none extra), and the card knows the family and its storage."""
    from exo_p2p.models.card.derive import card_from_model_dir
    from tests.support.models.synthetic_families import make_family_model
    from worker.engine.loading.loader import load_all

    model_dir = make_family_model(tmp_path / family, family, n_layers=2 if family != "gpt_oss" else 2)
    loaded = load_all(model_dir)
    assert type(loaded.model).__module__.endswith(family if family != "mistral" else "llama")
    got = card_from_model_dir(model_dir, family)
    assert got.architecture == family and got.quantization == "float32" and got.n_layers == 2
    again = make_family_model(tmp_path / "again", family, n_layers=2)
    assert (again / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()


def test_unknown_family_is_refused_by_the_maker(tmp_path) -> None:
    from tests.support.models.synthetic_families import make_family_model

    with pytest.raises(KeyError, match="unknown family"):
        make_family_model(tmp_path / "x", "nope")
    with pytest.raises(ValueError, match="even layer count"):
        make_family_model(tmp_path / "y", "gpt_oss", n_layers=3)


def test_the_listing_shows_family_quantization_and_shardings(tmp_path) -> None:
    """``GET /models``'s entry and ``exo-p2p models`` (table and ``--json`` fields) of a
    family model, from its card."""
    import io

    from rich.console import Console

    from exo_p2p.api.views import local_model
    from exo_p2p.cli.output.json_shapes import MODEL_FIELDS, models_json
    from exo_p2p.cli.output.render import models_table
    from exo_p2p.models.card.derive import card_from_model_dir
    from tests.support.models.synthetic_models import make_synthetic_model
    from tests.support.models.synthetic_families import make_family_model

    phi = msgspec.to_builtins(local_model(card_from_model_dir(make_family_model(tmp_path / "p", "phi3"), "p")))
    assert (phi["family"], phi["quantization"], phi["shardings"]) == ("phi3", "float32", ["pipeline"])
    assert NO_MLX_SHARD in phi["sharding_notes"]["tensor"]
    q4 = msgspec.to_builtins(local_model(card_from_model_dir(make_synthetic_model(tmp_path / "q", quantize=True), "q")))
    assert (q4["family"], q4["quantization"], q4["shardings"]) == ("llama", "4-bit, group 32, some modules 8-bit",
                                                                   ["pipeline", "tensor"])
    assert {"family", "quantization", "shardings"} <= set(MODEL_FIELDS)
    assert models_json([{"model": "old"}])[0]["shardings"] is None  # a node from before the fields
    out = io.StringIO()
    Console(file=out, width=200).print(models_table([phi, q4, {"model": "old", "n_layers": 2}]))
    text = out.getvalue()
    assert "phi3" in text and "float32" in text and "4-bit g32 +8-bit" in text and "pipeline, tensor" in text
    assert "one node only" in text  # the old node's entry names no sharding
