"""The exceptions of lnorm, one per code of liblnorm's error table
(include/lnorm/errors.h, LNORM_ERRNO_MAP). A class is named after its code's
message in CamelCase ("invalid argument" -> InvalidArgument); the test
tests/python/test_errors.py checks this list against the library's table.
"""
from __future__ import annotations

from typing import Dict, Optional, Type


class Error(Exception):
    """A failed lnorm call.

    Attributes:
        code: the lnorm error code (``lnorm_err``, e.g. 1 for LNORM_EINVAL).
        errname: its symbolic name, e.g. ``"LNORM_EINVAL"``.
        status: the wire status of the failing reply; -1 when no reply came
            (the client refused the call itself, or the transport failed).
        message: the server's status message, or the client's reason.
    """

    code: int = -1
    errname: str = "LNORM_UNKNOWN"
    description: str = "unknown error"

    def __init__(self, message: str = "", status: int = -1, code: Optional[int] = None) -> None:
        if code is not None:
            self.code = code
        self.status = status
        self.message = message
        super().__init__(f"{self.description}: {message}" if message else self.description)


class InvalidArgument(Error, ValueError):
    """LNORM_EINVAL (1): invalid argument."""
    code = 1
    errname = "LNORM_EINVAL"
    description = "invalid argument"


class OutOfMemory(Error, MemoryError):
    """LNORM_ENOMEM (2): out of memory."""
    code = 2
    errname = "LNORM_ENOMEM"
    description = "out of memory"


class NotFound(Error):
    """LNORM_ENOTFOUND (3): not found."""
    code = 3
    errname = "LNORM_ENOTFOUND"
    description = "not found"


class AlreadyExists(Error):
    """LNORM_EEXIST (4): already exists."""
    code = 4
    errname = "LNORM_EEXIST"
    description = "already exists"


class ResourceLimitExceeded(Error):
    """LNORM_ELIMIT (5): resource limit exceeded."""
    code = 5
    errname = "LNORM_ELIMIT"
    description = "resource limit exceeded"


class QueueFull(Error):
    """LNORM_EQUEUEFULL (6): queue full."""
    code = 6
    errname = "LNORM_EQUEUEFULL"
    description = "queue full"


class DeadlineExceeded(Error, TimeoutError):
    """LNORM_ETIMEDOUT (7): deadline exceeded."""
    code = 7
    errname = "LNORM_ETIMEDOUT"
    description = "deadline exceeded"


class ServiceUnavailable(Error):
    """LNORM_EUNAVAIL (8): service unavailable."""
    code = 8
    errname = "LNORM_EUNAVAIL"
    description = "service unavailable"


class ObjectClosed(Error):
    """LNORM_ECLOSED (9): object closed."""
    code = 9
    errname = "LNORM_ECLOSED"
    description = "object closed"


class ProtocolError(Error):
    """LNORM_EPROTO (10): protocol error."""
    code = 10
    errname = "LNORM_EPROTO"
    description = "protocol error"


class TransportError(Error):
    """LNORM_ETRANSPORT (11): transport error."""
    code = 11
    errname = "LNORM_ETRANSPORT"
    description = "transport error"


class BackendFailure(Error):
    """LNORM_EBACKEND (12): backend failure."""
    code = 12
    errname = "LNORM_EBACKEND"
    description = "backend failure"


class NotSupported(Error):
    """LNORM_ENOTSUP (13): not supported."""
    code = 13
    errname = "LNORM_ENOTSUP"
    description = "not supported"


class InternalError(Error):
    """LNORM_EINTERNAL (14): internal error."""
    code = 14
    errname = "LNORM_EINTERNAL"
    description = "internal error"


class InputOutputError(Error):
    """LNORM_EIO (15): input/output error."""
    code = 15
    errname = "LNORM_EIO"
    description = "input/output error"


class OperationCanceled(Error):
    """LNORM_ECANCELED (16): operation canceled."""
    code = 16
    errname = "LNORM_ECANCELED"
    description = "operation canceled"


class NoSuchDevice(Error):
    """LNORM_ENODEV (17): no such device."""
    code = 17
    errname = "LNORM_ENODEV"
    description = "no such device"


class CUDAError(Error):
    """LNORM_ECUDA (18): CUDA error."""
    code = 18
    errname = "LNORM_ECUDA"
    description = "CUDA error"


class PermissionDenied(Error):
    """LNORM_EPERM (19): permission denied."""
    code = 19
    errname = "LNORM_EPERM"
    description = "permission denied"


BY_CODE: Dict[int, Type[Error]] = {cls.code: cls for cls in Error.__subclasses__()}


def from_code(code: int, message: str = "", status: int = -1) -> Error:
    """The exception for an lnorm error code (Error itself for an unknown one)."""
    cls = BY_CODE.get(code)
    if cls is None:
        return Error(message, status, code=code)
    return cls(message, status)
