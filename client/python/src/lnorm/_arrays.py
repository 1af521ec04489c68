"""numpy (and torch CPU) arrays to and from the buffers liblnorm reads and
writes: dtype codes, shapes, and views instead of copies wherever the layout
allows. bf16 is ml_dtypes.bfloat16 on the numpy side."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import ml_dtypes
import numpy as np

from . import errors

try:  # torch is optional
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

DTYPE_NONE, DTYPE_F32, DTYPE_F16, DTYPE_BF16 = 0, 1, 2, 3

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_CODES = {np.dtype(np.float32): DTYPE_F32, np.dtype(np.float16): DTYPE_F16, BFLOAT16: DTYPE_BF16}
_NAMES = {"f32": np.float32, "float32": np.float32, "f16": np.float16, "float16": np.float16,
          "half": np.float16, "bf16": BFLOAT16, "bfloat16": BFLOAT16}


def is_torch(a: Any) -> bool:
    """Whether a is a torch tensor (False when torch is not installed)."""
    return torch is not None and isinstance(a, torch.Tensor)


def to_dtype(d: Any) -> np.dtype:
    """A numpy dtype from a numpy dtype, a name ("bf16", "float32") or a torch dtype."""
    if torch is not None and isinstance(d, torch.dtype):
        d = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: BFLOAT16}.get(d, d)
    if isinstance(d, str) and d.lower() in _NAMES:
        d = _NAMES[d.lower()]
    try:
        dt = np.dtype(d)
    except TypeError:
        raise errors.InvalidArgument(f"dtype {d!r} is not one of float32, float16, bfloat16") from None
    if dt not in _CODES:
        raise errors.InvalidArgument(f"dtype {dt} is not one of float32, float16, bfloat16")
    return dt


def code(dt: np.dtype) -> int:
    """The lnorm_dtype of a numpy dtype."""
    return _CODES[to_dtype(dt)]


def _torch_to_numpy(t: Any, what: str) -> np.ndarray:
    if t.device.type != "cpu":
        raise errors.NotSupported(f"{what}: a {t.device.type} tensor; only CPU tensors are sent "
                                  "(call .cpu() first)")
    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.bfloat16:  # numpy has no bf16: view the bits
        return t.view(torch.int16).numpy().view(BFLOAT16)
    return t.numpy()


def to_torch(a: np.ndarray) -> Any:
    """A torch tensor sharing a's memory."""
    if a.dtype == BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def as_input(a: Any, what: str, dtype: Optional[np.dtype] = None) -> np.ndarray:
    """A C-contiguous numpy array of a served dtype for an input tensor: a
    itself (or its memory, for a torch tensor) when it already is one, else
    a copy. A list or other array-like becomes float32 unless dtype says."""
    if is_torch(a):
        a = _torch_to_numpy(a, what)
    elif not isinstance(a, np.ndarray):
        a = np.asarray(a, dtype=dtype if dtype is not None else np.float32)
    if a.dtype not in _CODES:
        raise errors.InvalidArgument(f"{what}: dtype {a.dtype} is not one of float32, float16, bfloat16 "
                                     f"(convert first, e.g. {what}.astype(np.float32))")
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def rows_hidden(shape: Tuple[int, ...], what: str) -> Tuple[int, int]:
    """(rows, hidden) of a tensor whose last axis is the normalized one."""
    if len(shape) == 0:
        raise errors.InvalidArgument(f"{what}: a scalar; give at least one axis")
    hidden = int(shape[-1])
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    if hidden == 0 or rows == 0:
        raise errors.InvalidArgument(f"{what}: empty shape {tuple(shape)}")
    return rows, hidden


def as_output(out: Any, shape: Tuple[int, ...], dtype: np.dtype, what: str) -> np.ndarray:
    """The numpy array an output is written into: a new one, or the caller's
    (numpy or torch), which must have the exact shape and dtype and be
    C-contiguous and writable."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    arr = _torch_to_numpy(out, what) if is_torch(out) else out
    if not isinstance(arr, np.ndarray):
        raise errors.InvalidArgument(f"{what}: must be a numpy array or torch tensor")
    if arr.shape != tuple(shape) or arr.dtype != dtype:
        raise errors.InvalidArgument(f"{what}: shape {arr.shape} {arr.dtype}, expected {tuple(shape)} {dtype}")
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise errors.InvalidArgument(f"{what}: must be C-contiguous and writable")
    return arr


def ptr(a: Optional[np.ndarray]) -> Optional[int]:
    """The address of an array's first element (None for None)."""
    return None if a is None else a.ctypes.data
