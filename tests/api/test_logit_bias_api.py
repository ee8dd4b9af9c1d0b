from __future__ import annotations

import pytest

from tests.api.conftest import MakeClient
from tests.api.test_errors_api import assert_error

USER = [{"role": "user", "content": "hi"}]


async def test_logit_bias_reaches_the_engine_as_id_bias_pairs(make_client: MakeClient) -> None:
    client, engine = await make_client()
    r = await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": USER, "logit_bias": {"5": 100, "17": -100}}
    )
    assert r.status_code == 200, r.text
    request = engine.requests[0]
    assert request.logit_bias == ((5, 100.0), (17, -100.0))
    assert request.vocab_size >= engine.tokenizer.vocab_size


@pytest.mark.parametrize("bias", [{"x": 1}, {"999999": 1}, {"5": 101}, {"-1": 3}])
async def test_bad_logit_bias_is_400(make_client: MakeClient, bias: dict) -> None:
    client, engine = await make_client()
    r = await client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "logit_bias": bias})
    assert_error(r, 400, param="logit_bias")
    assert engine.requests == []
