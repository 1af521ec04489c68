"""Errors: one exception class per code of liblnorm's error table, raised
with the server's message (or the client's reason when no reply came)."""
from __future__ import annotations

import re
import time

import numpy as np
import pytest

import lnorm
from lnorm import errors
from lnorm._lib import lib


def camel(message: str) -> str:
    return "".join(w if w.isupper() else w.capitalize() for w in re.split(r"[ /]", message))


def test_classes_follow_the_table():
    """Every code liblnorm names has its class, named from its message."""
    seen = 0
    for code in range(1, 256):
        name = lib.lnorm_errname(code).decode()
        if name == "LNORM_UNKNOWN":
            break
        msg = lib.lnorm_strerror(code).decode()
        cls = getattr(lnorm, camel(msg), None)
        assert cls is not None, f"no lnorm.{camel(msg)} for {name}"
        assert issubclass(cls, lnorm.Error) and cls.code == code and cls.errname == name, name
        assert errors.from_code(code).__class__ is cls
        seen += 1
    assert seen == len(errors.BY_CODE) >= 19


def test_server_message(client):
    """A request the server refuses carries the server's status text."""
    info = client.info()
    x = np.zeros((1, info.max_hidden + 1), np.float32)
    with pytest.raises(lnorm.Error) as e:
        client.normalize(x)
    assert isinstance(e.value, (lnorm.InvalidArgument, lnorm.ResourceLimitExceeded)), repr(e.value)
    assert e.value.status > 0 and "hidden" in e.value.message, repr(e.value)


def test_client_side_checks(client):
    x = np.ones((2, 8), np.float32)
    cases = [
        dict(eps=0.0), dict(eps=float("nan")), dict(op="softmax"), dict(eps_mode="middle"),
        dict(gamma=np.ones(7, np.float32)), dict(residual=np.ones((2, 8), np.float16)),
        dict(gamma=np.ones(8, np.float32), beta=np.ones(8, np.float16)),
        dict(gamma=np.ones(8, np.float32), params_id="p"), dict(out_dtype=np.float64),
        dict(out=np.empty((2, 8), np.float16)), dict(out=np.empty((8, 2), np.float32)),
    ]
    for kw in cases:
        with pytest.raises(lnorm.InvalidArgument):
            client.normalize(x, **kw)
    with pytest.raises(lnorm.InvalidArgument, match="float64"):
        client.normalize(np.ones((2, 8)))
    with pytest.raises(lnorm.InvalidArgument):
        client.normalize(np.float32(1.0))
    with pytest.raises(ValueError):  # InvalidArgument is a ValueError too
        client.normalize(np.ones((0, 8), np.float32))


def test_mean_for_rmsnorm_not_sent(client):
    r = client.normalize(np.ones((2, 8), np.float32) + np.arange(8, dtype=np.float32), "rms", stats=True)
    assert r.mean is None and r.rstd.shape == (2,)


def test_no_server_is_unavailable(tmp_path):
    """Nobody listening: said at once, naming the URL, whatever the timeouts."""
    url = f"ipc://{tmp_path}/nobody.sock"
    t0 = time.monotonic()
    with lnorm.Client(url, send_timeout_ms=10000, timeout_ms=30000) as c:
        with pytest.raises(lnorm.ServiceUnavailable) as e:
            c.health()
        with pytest.raises(lnorm.ServiceUnavailable):
            c.normalize(np.ones((2, 8), np.float32))
    assert time.monotonic() - t0 < 1.0
    assert e.value.status == -1 and f"no lnormd is listening at {url}" in str(e.value)


def test_closed_client(daemon):
    c = lnorm.Client(daemon.ipc_url)
    c.close()
    c.close()
    with pytest.raises(lnorm.ObjectClosed):
        c.health()


def test_bad_url():
    with pytest.raises(lnorm.Error):
        lnorm.Client("nosuchscheme://x")
