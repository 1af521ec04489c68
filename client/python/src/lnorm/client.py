"""lnorm.Client: the synchronous client, one liblnorm client underneath."""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Union

from . import _arrays as arr
from . import errors
from ._backward import BackwardCall
from ._call import Call, EpsModeLike, OpLike, raise_for
from ._lib import ClientOpts, ParamsDesc, Result, ServerInfo as _CInfo, lib

DEFAULT_EPS = 1e-5


@dataclass(frozen=True)
class Device:
    """One compute device of a server."""
    backend: str
    name: str
    memory_bytes: int
    index: int


@dataclass(frozen=True)
class ServerInfo:
    """A server's version, backends, devices and limits (0: not reported)."""
    version: str
    backends: List[str]
    devices: List[Device] = field(default_factory=list)
    max_message_bytes: int = 0
    max_rows: int = 0
    max_hidden: int = 0
    max_batch_rows: int = 0
    max_batch_bytes: int = 0
    max_queue_requests: int = 0
    max_params_bytes: int = 0
    max_inflight_bytes: int = 0
    shm: bool = False


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


class Client:
    """A client of one or several lnormd servers.

    Args:
        url: an NNG URL (``tcp://host:port``, ``ipc:///path``, ``tls+tcp://host:port``)
            or a list of them; every URL is dialed and requests go to whichever
            connection is ready. Dials do not wait: a server that is down is
            dialed again in the background.
        timeout_ms: how long a call waits for its reply (default 30000; negative: forever).
        send_timeout_ms: how long a call waits for a connection (default 10000).
        chunk_bytes: bytes of x per request when a large call is split by rows
            (default 1 MiB).
        pipeline_depth: chunks of one call in flight at once (default 2).
        send_deadline: also send timeout_ms as the server-side deadline.
        tls_ca_file, tls_cert_key_file, tls_server_name, tls_insecure: TLS for
            ``tls+tcp://`` URLs (docs/security.md).
        auto_shm_bytes: calls of at least this many bytes go through shared
            memory when every URL is ``ipc://`` and the daemon allows it
            (docs/shm.md; default 0: never).

    One client may be used from many threads at once; calls release the GIL
    while they wait. Use it as a context manager, or call close().
    """

    def __init__(self, url: Union[str, Sequence[str]], *, timeout_ms: Optional[int] = None,
                 send_timeout_ms: Optional[int] = None, chunk_bytes: Optional[int] = None,
                 pipeline_depth: Optional[int] = None, send_deadline: bool = False,
                 tls_ca_file: Optional[str] = None, tls_cert_key_file: Optional[str] = None,
                 tls_server_name: Optional[str] = None, tls_insecure: bool = False,
                 auto_shm_bytes: int = 0) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise errors.InvalidArgument("url: give at least one URL")
        opts = ClientOpts()
        lib.lnorm_client_opts_init(ctypes.byref(opts))
        if timeout_ms is not None:
            opts.recv_timeout_ms = int(timeout_ms)
        if send_timeout_ms is not None:
            opts.send_timeout_ms = int(send_timeout_ms)
        if chunk_bytes is not None:
            opts.chunk_bytes = int(chunk_bytes)
        if pipeline_depth is not None:
            opts.pipeline_depth = int(pipeline_depth)
        opts.send_deadline = int(bool(send_deadline))
        self._strings = [s.encode() if s is not None else None
                         for s in (tls_ca_file, tls_cert_key_file, tls_server_name)]
        opts.tls_ca_file, opts.tls_cert_key_file, opts.tls_server_name = self._strings
        opts.tls_insecure = int(bool(tls_insecure))
        opts.auto_shm_bytes = int(auto_shm_bytes)
        curls = (ctypes.c_char_p * len(urls))(*[u.encode() for u in urls])
        handle = ctypes.c_void_p()
        rv = lib.lnorm_client_open(ctypes.byref(handle), curls, len(urls), ctypes.byref(opts))
        if rv != 0:
            raise errors.from_code(rv, f"cannot open a client for {', '.join(urls)}")
        self.urls = urls
        self._handle: Optional[int] = handle.value
        self._lock = threading.Condition()
        self._calls = 0

    # A handle is borrowed for the length of one C call; close() waits for
    # the borrowed ones, so that no call ever reaches a freed client.
    def _borrow(self) -> int:
        with self._lock:
            if self._handle is None:
                raise errors.ObjectClosed("the client is closed")
            self._calls += 1
            return self._handle

    def _return(self) -> None:
        with self._lock:
            self._calls -= 1
            if self._calls == 0:
                self._lock.notify_all()

    def close(self) -> None:
        """Close the client. Waits for synchronous calls of other threads to
        end; asynchronous calls in flight fail with ObjectClosed. A second
        close does nothing."""
        with self._lock:
            if self._handle is None:
                return
            handle, self._handle = self._handle, None
            while self._calls:
                self._lock.wait()
        lib.lnorm_client_close(handle)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self.close()

    def _run(self, fn: Any, *args: Any) -> Result:
        res = Result()
        h = self._borrow()
        try:
            rv = fn(h, *args, ctypes.byref(res))
        finally:
            self._return()
        raise_for(rv, res)
        return res

    def normalize(self, x: Any, op: OpLike = "layernorm", *, gamma: Any = None, beta: Any = None,
                  residual: Any = None, eps: float = DEFAULT_EPS, eps_mode: EpsModeLike = "inside",
                  stats: bool = False, out_dtype: Any = None, params_id: Optional[str] = None,
                  out: Any = None, timeout_ms: Optional[int] = None, priority: int = 0,
                  max_queue_us: int = 0) -> Any:
        """Normalize x over its last axis on the server.

        Args:
            x: numpy array (float32, float16 or ml_dtypes.bfloat16) or torch CPU
                tensor of any shape; its last axis is normalized, every other
                axis is rows. A C-contiguous x is sent from its own memory;
                another layout is copied once first.
            op: ``"layernorm"`` (``"ln"``) or ``"rmsnorm"`` (``"rms"``), or an Op.
            gamma, beta: optional scale and shift, one value per element of the
                last axis, float32 or x's dtype (both the same).
            residual: optional tensor of x's shape and dtype added to x before
                normalizing; x + residual comes back as ``residual_out``.
            eps: added to the variance (``eps_mode="inside"``, PyTorch's
                convention) or to the standard deviation (``"outside"``).
            stats: also return mean (LayerNorm) and rstd per row, float32.
            out_dtype: dtype of y (float32, float16, bfloat16; default x's).
            params_id: use gamma/beta registered with register_params instead.
            out: write y into this array (x's shape, out_dtype, C-contiguous);
                ``out=x`` normalizes in place.
            timeout_ms: this call's reply timeout (default: the client's).
            priority: the server's batching priority level (0: its default).
            max_queue_us: longest wait in the server's queue (0: its default).

        Returns:
            y (numpy array, or a torch tensor when x is one) of x's shape; or,
            with ``stats=True`` or a residual, a Normalized tuple
            ``(y, mean, rstd, residual_out)``.

        Raises:
            lnorm.Error subclasses named after liblnorm's error codes, e.g.
            InvalidArgument (with the field at fault), ResourceLimitExceeded,
            DeadlineExceeded, ServiceUnavailable; the message is the server's.
        """
        call = Call(x, op, gamma, beta, residual, eps, eps_mode, stats, out_dtype, params_id, out,
                    timeout_ms, priority, max_queue_us)
        self._run(lib.lnorm_normalize, ctypes.byref(call.req))
        return call.finish()

    def normalize_backward(self, x: Any, dy: Any, op: OpLike = "layernorm", *, gamma: Any = None,
                           params_id: Optional[str] = None, mean: Any = None, rstd: Any = None,
                           dres: Any = None, eps: float = DEFAULT_EPS, eps_mode: EpsModeLike = "inside",
                           dx_dtype: Any = None, dx: bool = True, dgamma: bool = False, dbeta: bool = False,
                           out: Any = None, timeout_ms: Optional[int] = None, priority: int = 0,
                           max_queue_us: int = 0) -> Any:
        """The gradients of a normalize over x's last axis, on the server.

        Args:
            x: what the forward normalized (x + residual when it fused one);
                numpy array or torch CPU tensor, float32 / float16 / bfloat16.
            dy: the gradient of the forward's output, x's shape (any served dtype).
            op, eps, eps_mode: the forward's.
            gamma: the forward's gamma (one value per element of the last axis),
                or params_id: gamma registered with register_params.
            mean, rstd: the forward's statistics (``stats=True``), float32, one
                per row; recomputed by the server when not given (LayerNorm
                takes both or neither, RMSNorm rstd only).
            dres: the gradient that reached the forward's residual_out (x's
                shape and dtype); added to dx, which is then the gradient of
                both x and the residual.
            dx_dtype: dtype of dx (default x's). dx, dgamma, dbeta: which
                gradients to return (at least one).
            out: write dx into this array (x's shape, dx_dtype, C-contiguous).
            timeout_ms, priority, max_queue_us: as normalize.

        Returns:
            dx (numpy array, or a torch tensor when x is one); or, with
            ``dgamma=True`` or ``dbeta=True``, a Gradients tuple
            ``(dx, dgamma, dbeta)`` (None for those not asked for). A large
            call is split by rows; its dgamma / dbeta are the sums of the
            parts (their bits depend on the split, see docs/client.md).
        """
        call = BackwardCall(x, dy, op, gamma, params_id, mean, rstd, dres, eps, eps_mode, dx_dtype, dx, dgamma,
                            dbeta, out, timeout_ms, priority, max_queue_us)
        self._run(lib.lnorm_normalize_backward, ctypes.byref(call.req))
        return call.finish()

    def register_params(self, params_id: str, gamma: Any = None, beta: Any = None) -> None:
        """Register gamma and/or beta on the server under params_id (1..128
        characters of [A-Za-z0-9_.:-]) for later normalize calls with
        ``params_id=``. Both are 1-D of one dtype (float32, float16, bfloat16).
        Raises AlreadyExists when the id is taken."""
        given = [(n, arr.as_input(p, n)) for n, p in (("gamma", gamma), ("beta", beta)) if p is not None]
        if not given:
            raise errors.InvalidArgument("register_params: give gamma, beta or both")
        first = given[0][1]
        for name, a in given:
            if a.ndim != 1 or a.shape != first.shape or a.dtype != first.dtype:
                raise errors.InvalidArgument(f"{name}: {a.shape} {a.dtype}; gamma and beta are 1-D, "
                                             "of one length and dtype")
        d = dict(given)
        desc = ParamsDesc(id=params_id.encode(), dtype=arr.code(first.dtype), hidden=first.shape[0],
                          gamma=arr.ptr(d.get("gamma")), beta=arr.ptr(d.get("beta")))
        self._run(lib.lnorm_register_params, ctypes.byref(desc))

    def drop_params(self, params_id: str) -> None:
        """Drop registered parameters (NotFound when the id is unknown)."""
        self._run(lib.lnorm_drop_params, params_id.encode())

    def health(self) -> bool:
        """Whether a server answers that it is serving (False while it drains)."""
        serving = ctypes.c_int(0)
        self._run(lib.lnorm_health, ctypes.byref(serving))
        return bool(serving.value)

    def info(self) -> ServerInfo:
        """A server's version, backends, devices and limits."""
        ci = _CInfo()
        self._run(lib.lnorm_info, ctypes.byref(ci))
        devices = [Device(_text(d.backend), _text(d.name), d.memory_bytes, d.index)
                   for d in ci.devices[:max(0, min(ci.ndevices, len(ci.devices)))]]
        backends = [_text(ci.backends[i].value) for i in range(max(0, min(ci.nbackends, len(ci.backends))))]
        limits = {k: getattr(ci, k) for k in ("max_message_bytes", "max_rows", "max_hidden", "max_batch_rows",
                                              "max_batch_bytes", "max_queue_requests", "max_params_bytes",
                                              "max_inflight_bytes")}
        return ServerInfo(version=_text(ci.version), backends=backends, devices=devices, shm=bool(ci.shm),
                          **limits)
