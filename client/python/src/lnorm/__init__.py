"""lnorm: the Python client of lnormd (LayerNorm / RMSNorm served over NNG).

    import numpy as np, lnorm
    with lnorm.Client("tcp://127.0.0.1:7878") as c:
        y = c.normalize(np.random.randn(8, 4096).astype(np.float32), "layernorm")

A thin layer over liblnorm (ctypes): numpy arrays and torch CPU tensors in
and out, bf16 as ml_dtypes.bfloat16, errors as exceptions named after
liblnorm's error table. See docs/python.md.
"""
from ._arrays import BFLOAT16 as bfloat16
from ._backward import Gradients
from ._call import EpsMode, Normalized, Op
from ._lib import lib as _clib
from .aio import AsyncClient
from .client import Client, Device, ServerInfo
from .errors import (AlreadyExists, BackendFailure, CUDAError, DeadlineExceeded, Error, InputOutputError,
                     InternalError, InvalidArgument, NoSuchDevice, NotFound, NotSupported, ObjectClosed,
                     OperationCanceled, OutOfMemory, PermissionDenied, ProtocolError, QueueFull,
                     ResourceLimitExceeded, ServiceUnavailable, TransportError)

__version__ = "0.1.0"
library_version: str = _clib.lnorm_client_version().decode()

__all__ = [
    "Client", "AsyncClient", "Op", "EpsMode", "Normalized", "Gradients", "ServerInfo", "Device", "bfloat16",
    "Error", "InvalidArgument", "OutOfMemory", "NotFound", "AlreadyExists", "ResourceLimitExceeded",
    "QueueFull", "DeadlineExceeded", "ServiceUnavailable", "ObjectClosed", "ProtocolError",
    "TransportError", "BackendFailure", "NotSupported", "InternalError", "InputOutputError",
    "OperationCanceled", "NoSuchDevice", "CUDAError", "PermissionDenied", "library_version",
]
