"""lnorm.AsyncClient: the asyncio client. normalize runs on liblnorm's own
asynchronous call (no thread per call: many calls may be in flight on one
event loop); health, info and the params calls run in a worker thread."""
from __future__ import annotations

import asyncio
import ctypes
import itertools
import threading
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from . import errors
from ._backward import BackwardCall
from ._call import Call, EpsModeLike, OpLike
from ._lib import CALLBACK, lib
from .client import DEFAULT_EPS, Client, ServerInfo

# Calls in flight: key -> (loop, future, call). The call holds every buffer
# liblnorm reads or writes until its callback has run.
_pending: Dict[int, Tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Union[Call, BackwardCall]]] = {}
_pending_lock = threading.Lock()
_keys = itertools.count(1)


def _settle(fut: "asyncio.Future[Any]", call: Union[Call, BackwardCall], rv: int, message: str,
            status: int) -> None:
    if fut.done():  # the awaiting task was cancelled
        return
    if rv != 0:
        fut.set_exception(errors.from_code(rv, message, status))
    else:
        fut.set_result(call.finish())


@CALLBACK
def _on_done(arg: Optional[int], err: int, res: Any) -> None:
    # Runs on an NNG thread: copy what the result says, hand it to the loop.
    with _pending_lock:
        entry = _pending.pop(arg or 0, None)
    if entry is None:
        return
    loop, fut, call = entry
    message = res.contents.message.decode("utf-8", "replace") if res else ""
    status = res.contents.status if res else -1
    try:
        loop.call_soon_threadsafe(_settle, fut, call, err, message, status)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass


class AsyncClient:
    """The asyncio twin of Client: the same arguments, and coroutines for
    every call. Use ``async with lnorm.AsyncClient(url) as c: y = await
    c.normalize(x)``; any number of normalize calls may be in flight at once
    (``asyncio.gather``)."""

    def __init__(self, url: Union[str, Sequence[str]], **options: Any) -> None:
        self._client = Client(url, **options)

    @property
    def urls(self) -> list:
        return self._client.urls

    async def normalize(self, x: Any, op: OpLike = "layernorm", *, gamma: Any = None, beta: Any = None,
                        residual: Any = None, eps: float = DEFAULT_EPS, eps_mode: EpsModeLike = "inside",
                        stats: bool = False, out_dtype: Any = None, params_id: Optional[str] = None,
                        out: Any = None, timeout_ms: Optional[int] = None, priority: int = 0,
                        max_queue_us: int = 0) -> Any:
        """Normalize x over its last axis; see Client.normalize. Cancelling
        the awaiting task abandons the reply (the buffers are kept until the
        library is done with them)."""
        call = Call(x, op, gamma, beta, residual, eps, eps_mode, stats, out_dtype, params_id, out,
                    timeout_ms, priority, max_queue_us)
        why = ctypes.c_char_p()
        if lib.lnorm_normalize_req_check(ctypes.byref(call.req), ctypes.byref(why)) != 0:
            raise errors.InvalidArgument((why.value or b"").decode())
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        key = next(_keys)
        with _pending_lock:
            _pending[key] = (loop, fut, call)
        h = self._client._borrow()
        try:
            rv = lib.lnorm_normalize_async(h, ctypes.byref(call.req), _on_done, key)
        finally:
            self._client._return()
        if rv != 0:  # not started: the callback will not run
            with _pending_lock:
                _pending.pop(key, None)
            raise errors.from_code(rv, "")
        return await fut

    async def normalize_backward(self, x: Any, dy: Any, op: OpLike = "layernorm", *, gamma: Any = None,
                                 params_id: Optional[str] = None, mean: Any = None, rstd: Any = None,
                                 dres: Any = None, eps: float = DEFAULT_EPS, eps_mode: EpsModeLike = "inside",
                                 dx_dtype: Any = None, dx: bool = True, dgamma: bool = False,
                                 dbeta: bool = False, out: Any = None, timeout_ms: Optional[int] = None,
                                 priority: int = 0, max_queue_us: int = 0) -> Any:
        """The gradients; see Client.normalize_backward."""
        call = BackwardCall(x, dy, op, gamma, params_id, mean, rstd, dres, eps, eps_mode, dx_dtype, dx, dgamma,
                            dbeta, out, timeout_ms, priority, max_queue_us)
        why = ctypes.c_char_p()
        if lib.lnorm_normalize_backward_req_check(ctypes.byref(call.req), ctypes.byref(why)) != 0:
            raise errors.InvalidArgument((why.value or b"").decode())
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        key = next(_keys)
        with _pending_lock:
            _pending[key] = (loop, fut, call)
        h = self._client._borrow()
        try:
            rv = lib.lnorm_normalize_backward_async(h, ctypes.byref(call.req), _on_done, key)
        finally:
            self._client._return()
        if rv != 0:  # not started: the callback will not run
            with _pending_lock:
                _pending.pop(key, None)
            raise errors.from_code(rv, "")
        return await fut

    async def register_params(self, params_id: str, gamma: Any = None, beta: Any = None) -> None:
        """See Client.register_params."""
        await asyncio.to_thread(self._client.register_params, params_id, gamma, beta)

    async def drop_params(self, params_id: str) -> None:
        """See Client.drop_params."""
        await asyncio.to_thread(self._client.drop_params, params_id)

    async def health(self) -> bool:
        """See Client.health."""
        return await asyncio.to_thread(self._client.health)

    async def info(self) -> ServerInfo:
        """See Client.info."""
        return await asyncio.to_thread(self._client.info)

    async def close(self) -> None:
        """Close the client; normalize calls in flight fail with ObjectClosed."""
        await asyncio.to_thread(self._client.close)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
