"""Bad numbers in Ollama ``options``: a value the wire
cannot carry must be a 400 naming the option, not a 503 from the command that failed to
serialize on its way to the master."""

from __future__ import annotations

import msgspec
import pytest

from exo_p2p.api.errors import ApiError
from exo_p2p.api.families.anthropic.messages import MessagesRequest
from exo_p2p.api.families.common import logit_bias_pairs
from exo_p2p.api.families.ollama.generations import options_fields
from exo_p2p.api.schemas import MAX_TOKENS_LIMIT, TOKEN_ID_LIMIT, ChatCompletionRequest


@pytest.mark.parametrize("options", [{"num_predict": 10**30}, {"num_predict": 1e308}, {"num_predict": -(10**30)},
                                     {"repeat_last_n": 10**40}, {"num_predict": float("inf")},
                                     {"top_k": float("inf")}, {"temperature": float("nan")}, {"seed": float("inf")}])
def test_out_of_range_ollama_options_are_a_400(options: dict) -> None:
    with pytest.raises(ApiError) as err:
        options_fields(options)
    assert err.value.info.status == 400 and err.value.info.param.startswith("options.")


def test_in_range_ollama_options_pass() -> None:
    assert options_fields({"num_predict": MAX_TOKENS_LIMIT})["max_tokens"] == MAX_TOKENS_LIMIT
    assert "max_tokens" not in options_fields({"num_predict": -1})
    assert options_fields({"repeat_last_n": 64})["penalty_context"] == 64


@pytest.mark.parametrize("key", ["²", "١٢", str(2**31), "9" * 30, "-1", "x"])
def test_logit_bias_keys_that_are_no_token_id_are_a_400(key: str) -> None:
    """``"²"`` passes ``str.isdigit`` but not ``int()``: it used to be a 500; a huge id
    could not travel in the command (a 503 "no reachable master", a 500 on the master)."""
    with pytest.raises(ApiError) as err:
        logit_bias_pairs({key: 1})
    assert err.value.info.status == 400


def test_a_top_k_the_wire_cannot_carry_is_a_400() -> None:
    for schema in (ChatCompletionRequest, MessagesRequest):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "top_k": 10**30}
        with pytest.raises(msgspec.ValidationError, match="top_k"):
            msgspec.convert(body, schema)
        body["top_k"] = TOKEN_ID_LIMIT
        assert msgspec.convert(body, schema).top_k == TOKEN_ID_LIMIT
    assert logit_bias_pairs({" 5 ": 1, str(TOKEN_ID_LIMIT): -1}) == ((5, 1.0), (TOKEN_ID_LIMIT, -1.0))
