"""One backward call: the arguments checked and turned into an
lnorm_normalize_backward_req whose buffers stay alive with this object, and
the gradients turned back into what the caller gets. Shared by Client and
AsyncClient."""
from __future__ import annotations

import ctypes
from typing import Any, NamedTuple, Optional

import numpy as np

from . import _arrays as arr
from . import errors
from ._call import EpsModeLike, Op, OpLike, parse_eps_mode, parse_op
from ._lib import NormalizeBackwardReq, Result, lib


class Gradients(NamedTuple):
    """What normalize_backward returns when dgamma or dbeta is asked for.

    dx: x's shape (None with ``dx=False``); dgamma, dbeta: float32, one value
    per element of the last axis, summed over every row (None when not asked).
    """
    dx: Any
    dgamma: Any = None
    dbeta: Any = None


class BackwardCall:
    """A prepared backward call (see Client.normalize_backward)."""

    def __init__(self, x: Any, dy: Any, op: OpLike, gamma: Any, params_id: Optional[str], mean: Any, rstd: Any,
                 dres: Any, eps: float, eps_mode: EpsModeLike, dx_dtype: Any, dx: bool, dgamma: bool,
                 dbeta: bool, out: Any, timeout_ms: Optional[int], priority: int, max_queue_us: int) -> None:
        self.torch = arr.is_torch(x)
        opv = parse_op(op)
        self.x = arr.as_input(x, "x")
        shape = self.x.shape
        rows, hidden = arr.rows_hidden(shape, "x")
        d = arr.as_input(dy, "dy")
        if d.shape != shape:
            raise errors.InvalidArgument(f"dy: shape {d.shape}, expected x's {shape}")
        self.keep = [self.x, d]
        req = NormalizeBackwardReq()
        lib.lnorm_normalize_backward_req_init(ctypes.byref(req), int(opv), arr.code(self.x.dtype), rows, hidden)
        req.dy_dtype = arr.code(d.dtype)
        req.eps = float(eps)
        req.eps_mode = int(parse_eps_mode(eps_mode))
        req.x = arr.ptr(self.x)
        req.dy = arr.ptr(d)
        if gamma is not None and params_id:
            raise errors.InvalidArgument("gamma and params_id are exclusive")
        if gamma is not None:
            g = arr.as_input(gamma, "gamma")
            if g.shape != (hidden,):
                raise errors.InvalidArgument(f"gamma: shape {g.shape}, expected ({hidden},)")
            req.gamma = arr.ptr(g)
            req.param_dtype = arr.code(g.dtype)
            self.keep.append(g)
        if params_id:
            self.params_id = params_id.encode()
            req.params_id = self.params_id
        for name, v in (("mean", mean), ("rstd", rstd)):
            if v is None:
                continue
            s = arr.as_input(v, name, np.dtype(np.float32))
            if s.dtype != np.float32:
                raise errors.InvalidArgument(f"{name}: dtype {s.dtype}, expected float32 (the forward's statistics)")
            if s.size != rows:
                raise errors.InvalidArgument(f"{name}: {s.size} values, expected one per row ({rows})")
            setattr(req, name, arr.ptr(s))
            self.keep.append(s)
        if dres is not None:
            r = arr.as_input(dres, "dres")
            if r.shape != shape or r.dtype != self.x.dtype:
                raise errors.InvalidArgument(f"dres: {r.shape} {r.dtype}, expected x's {shape} {self.x.dtype}")
            req.dres = arr.ptr(r)
            self.keep.append(r)
        dxdt = self.x.dtype if dx_dtype is None else arr.to_dtype(dx_dtype)
        req.dx_dtype = arr.code(dxdt)
        self.dx = arr.as_output(out, shape, dxdt, "out") if dx else None
        self.dgamma = np.empty(hidden, dtype=np.float32) if dgamma else None
        self.dbeta = np.empty(hidden, dtype=np.float32) if dbeta else None
        if not (dx or dgamma or dbeta):
            raise errors.InvalidArgument("no output: ask for dx, dgamma or dbeta")
        req.dx = arr.ptr(self.dx)
        req.dgamma = arr.ptr(self.dgamma)
        req.dbeta = arr.ptr(self.dbeta)
        self.keep += [a for a in (self.dx, self.dgamma, self.dbeta) if a is not None]
        if timeout_ms is not None:
            req.timeout_ms = int(timeout_ms)
        req.priority = int(priority)
        req.max_queue_us = int(max_queue_us)
        self.op = opv
        self.req = req
        self.res = Result()

    def finish(self) -> Any:
        """The call's return value, once it succeeded."""
        conv = arr.to_torch if self.torch else (lambda a: a)
        dx = None if self.dx is None else conv(self.dx)
        if self.dgamma is None and self.dbeta is None:
            return dx
        return Gradients(dx=dx, dgamma=None if self.dgamma is None else conv(self.dgamma),
                         dbeta=None if self.dbeta is None else conv(self.dbeta))


__all__ = ["BackwardCall", "Gradients", "Op"]
