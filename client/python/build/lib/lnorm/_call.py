"""One normalize call: the arguments checked and turned into an
lnorm_normalize_req whose buffers stay alive with this object, and the
outputs turned back into what the caller gets. Shared by Client and
AsyncClient."""
from __future__ import annotations

import ctypes
import enum
from typing import Any, NamedTuple, Optional, Union

import numpy as np

from . import _arrays as arr
from . import errors
from ._lib import NormalizeReq, Result, lib


class Op(enum.IntEnum):
    """Which normalization (lnorm_op)."""
    LAYERNORM = 1
    RMSNORM = 2


class EpsMode(enum.IntEnum):
    """Where eps goes (lnorm_eps_mode): rstd = 1/sqrt(var + eps) or 1/(sqrt(var) + eps)."""
    INSIDE = 0
    OUTSIDE = 1


_OPS = {"layernorm": Op.LAYERNORM, "ln": Op.LAYERNORM, "layer_norm": Op.LAYERNORM,
        "rmsnorm": Op.RMSNORM, "rms": Op.RMSNORM, "rms_norm": Op.RMSNORM}
_EPS_MODES = {"inside": EpsMode.INSIDE, "outside": EpsMode.OUTSIDE}

OpLike = Union[Op, str, int]
EpsModeLike = Union[EpsMode, str, int]


class Normalized(NamedTuple):
    """What normalize returns when stats or a residual is asked for.

    y: the output, x's shape; mean (LayerNorm with stats) and rstd (with
    stats): float32, x's shape without its last axis; residual_out (with a
    residual): x + residual in x's dtype, x's shape. Absent ones are None.
    """
    y: Any
    mean: Any = None
    rstd: Any = None
    residual_out: Any = None


def parse_op(op: OpLike) -> Op:
    if isinstance(op, str):
        if op.lower() not in _OPS:
            raise errors.InvalidArgument(f"op {op!r}: expected one of {', '.join(sorted(_OPS))}")
        return _OPS[op.lower()]
    try:
        return Op(op)
    except ValueError:
        raise errors.InvalidArgument(f"op {op!r}: expected Op.LAYERNORM or Op.RMSNORM") from None


def parse_eps_mode(mode: EpsModeLike) -> EpsMode:
    if isinstance(mode, str):
        if mode.lower() not in _EPS_MODES:
            raise errors.InvalidArgument(f"eps_mode {mode!r}: expected 'inside' or 'outside'")
        return _EPS_MODES[mode.lower()]
    try:
        return EpsMode(mode)
    except ValueError:
        raise errors.InvalidArgument(f"eps_mode {mode!r}: expected EpsMode.INSIDE or OUTSIDE") from None


def raise_for(rv: int, res: Optional[Result]) -> None:
    """Raise the exception of a failed call (nothing for LNORM_OK)."""
    if rv == 0:
        return
    message = res.message.decode("utf-8", "replace") if res is not None else ""
    status = res.status if res is not None else -1
    raise errors.from_code(rv, message, status)


class Call:
    """A prepared normalize call (see Client.normalize for the arguments)."""

    def __init__(self, x: Any, op: OpLike, gamma: Any, beta: Any, residual: Any, eps: float,
                 eps_mode: EpsModeLike, stats: bool, out_dtype: Any, params_id: Optional[str],
                 out: Any, timeout_ms: Optional[int], priority: int, max_queue_us: int) -> None:
        self.torch = arr.is_torch(x)
        opv = parse_op(op)
        self.x = arr.as_input(x, "x")
        shape = self.x.shape
        rows, hidden = arr.rows_hidden(shape, "x")
        ydt = self.x.dtype if out_dtype is None else arr.to_dtype(out_dtype)
        self.y = arr.as_output(out, shape, ydt, "out")
        self.keep = [self.x, self.y]

        req = NormalizeReq()
        lib.lnorm_normalize_req_init(ctypes.byref(req), int(opv), arr.code(self.x.dtype), rows, hidden)
        req.y_dtype = arr.code(ydt)
        req.eps = float(eps)
        req.eps_mode = int(parse_eps_mode(eps_mode))
        req.x = arr.ptr(self.x)
        req.y = arr.ptr(self.y)

        params = [p for p in (gamma, beta) if p is not None]
        if params and params_id:
            raise errors.InvalidArgument("gamma/beta and params_id are exclusive")
        pdt = None
        for name, p in (("gamma", gamma), ("beta", beta)):
            if p is None:
                continue
            a = arr.as_input(p, name)
            if a.shape != (hidden,):
                raise errors.InvalidArgument(f"{name}: shape {a.shape}, expected ({hidden},)")
            if pdt is not None and a.dtype != pdt:
                raise errors.InvalidArgument(f"gamma is {pdt} but beta is {a.dtype}: give both in one dtype")
            pdt = a.dtype
            setattr(req, name, arr.ptr(a))
            self.keep.append(a)
        if pdt is not None:
            req.param_dtype = arr.code(pdt)
        if params_id:
            self.params_id = params_id.encode()
            req.params_id = self.params_id

        self.residual_out = None
        if residual is not None:
            r = arr.as_input(residual, "residual")
            if r.shape != shape or r.dtype != self.x.dtype:
                raise errors.InvalidArgument(f"residual: {r.shape} {r.dtype}, expected x's {shape} {self.x.dtype}")
            self.residual_out = np.empty(shape, dtype=self.x.dtype)
            req.residual = arr.ptr(r)
            req.residual_out = arr.ptr(self.residual_out)
            self.keep += [r, self.residual_out]

        self.stats = bool(stats)
        self.mean = self.rstd = None
        if self.stats:
            req.want_stats = 1
            self.rstd = np.empty(shape[:-1], dtype=np.float32)
            req.rstd = arr.ptr(self.rstd)
            if opv == Op.LAYERNORM:
                self.mean = np.empty(shape[:-1], dtype=np.float32)
                req.mean = arr.ptr(self.mean)
        if timeout_ms is not None:
            req.timeout_ms = int(timeout_ms)
        req.priority = int(priority)
        req.max_queue_us = int(max_queue_us)
        self.req = req
        self.res = Result()

    def finish(self) -> Any:
        """The call's return value, once it succeeded."""
        conv = arr.to_torch if self.torch else (lambda a: a)
        y = conv(self.y)
        if not self.stats and self.residual_out is None:
            return y
        return Normalized(y=y,
                          mean=None if self.mean is None else conv(self.mean),
                          rstd=None if self.rstd is None else conv(self.rstd),
                          residual_out=None if self.residual_out is None else conv(self.residual_out))
