"""register_params / drop_params, health and info."""
from __future__ import annotations

import numpy as np
import pytest

import lnorm
from reference import check, random


@pytest.mark.parametrize("dtype", [np.float32, np.float16, lnorm.bfloat16])
def test_registered_equals_inline(client, rng, request, dtype):
    hidden = 768
    gamma = random(rng, hidden, dtype, 1.0, 0.3)
    beta = random(rng, hidden, dtype, 0.0, 0.3)
    pid = f"py.{request.node.name}".replace("[", ".").replace("]", "")[:100]
    client.register_params(pid, gamma, beta)
    try:
        x = random(rng, (7, hidden), dtype)
        by_id = client.normalize(x, "ln", params_id=pid)
        inline = client.normalize(x, "ln", gamma=gamma, beta=beta)
        assert np.array_equal(by_id.view(np.uint8), inline.view(np.uint8))
        check("params_id", by_id, x, "layernorm", gamma, beta)
        with pytest.raises(lnorm.AlreadyExists) as e:
            client.register_params(pid, gamma)
        assert pid in str(e.value)
    finally:
        client.drop_params(pid)
    with pytest.raises(lnorm.NotFound):
        client.normalize(x, "ln", params_id=pid)
    with pytest.raises(lnorm.NotFound):
        client.drop_params(pid)


def test_register_refuses_mismatched(client):
    with pytest.raises(lnorm.InvalidArgument):
        client.register_params("py.mismatch", np.ones(8, np.float32), np.ones(9, np.float32))
    with pytest.raises(lnorm.InvalidArgument):
        client.register_params("py.mismatch", np.ones(8, np.float32), np.ones(8, np.float16))
    with pytest.raises(lnorm.InvalidArgument):
        client.register_params("py.nothing")
    with pytest.raises(lnorm.InvalidArgument) as e:
        client.register_params("bad id with spaces", np.ones(8, np.float32))
    assert e.value.message


def test_health_and_info(client, daemon):
    assert client.health() is True
    info = client.info()
    assert info.version == lnorm.library_version
    assert info.backends == ["cpu"]
    assert info.devices and info.devices[0].backend == "cpu"
    assert info.max_hidden >= 4096 and info.max_message_bytes > 0 and info.max_rows > 0
