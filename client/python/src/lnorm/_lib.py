"""Loads liblnorm and declares its C API (include/lnorm/lnorm.h) for ctypes.

The structures below mirror the public header field for field; the test
tests/python/test_layout.py compares every offset and size with the C
compiler's. The library is found, in order, at $LNORM_LIBRARY, beside this
file (a wheel may carry it), or by the system's loader (``liblnorm.so.0``).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_float, c_int, c_size_t,
                    c_uint32, c_uint64, c_void_p)

INFO_MAX_BACKENDS = 8
INFO_MAX_DEVICES = 16


class ClientOpts(Structure):
    """lnorm_client_opts."""
    _fields_ = [
        ("send_timeout_ms", c_int),
        ("recv_timeout_ms", c_int),
        ("reconnect_min_ms", c_int),
        ("reconnect_max_ms", c_int),
        ("resend_ms", c_int),
        ("chunk_bytes", c_size_t),
        ("pipeline_depth", c_int),
        ("max_recv_bytes", c_size_t),
        ("send_deadline", c_int),
        ("tls_ca_file", c_char_p),
        ("tls_cert_key_file", c_char_p),
        ("tls_server_name", c_char_p),
        ("tls_insecure", c_int),
        ("auto_shm_bytes", c_size_t),
    ]


class Result(Structure):
    """lnorm_result."""
    _fields_ = [
        ("err", c_int),
        ("status", c_int),
        ("message", c_char * 256),
        ("queue_us", c_uint64),
        ("compute_us", c_uint64),
        ("batch_rows", c_uint32),
        ("batch_requests", c_uint32),
        ("chunks", c_uint32),
    ]


class NormalizeReq(Structure):
    """lnorm_normalize_req."""
    _fields_ = [
        ("op", c_int),
        ("x_dtype", c_int),
        ("y_dtype", c_int),
        ("rows", c_uint64),
        ("hidden", c_uint64),
        ("eps", c_float),
        ("eps_mode", c_int),
        ("x", c_void_p),
        ("residual", c_void_p),
        ("param_dtype", c_int),
        ("gamma", c_void_p),
        ("beta", c_void_p),
        ("params_id", c_char_p),
        ("want_stats", c_int),
        ("y", c_void_p),
        ("mean", c_void_p),
        ("rstd", c_void_p),
        ("residual_out", c_void_p),
        ("timeout_ms", c_int),
        ("chunk_bytes", c_size_t),
        ("priority", c_uint32),
        ("max_queue_us", c_uint64),
    ]


class NormalizeBackwardReq(Structure):
    """lnorm_normalize_backward_req."""
    _fields_ = [
        ("op", c_int),
        ("x_dtype", c_int),
        ("dy_dtype", c_int),
        ("dx_dtype", c_int),
        ("rows", c_uint64),
        ("hidden", c_uint64),
        ("eps", c_float),
        ("eps_mode", c_int),
        ("x", c_void_p),
        ("dy", c_void_p),
        ("dres", c_void_p),
        ("param_dtype", c_int),
        ("gamma", c_void_p),
        ("params_id", c_char_p),
        ("mean", c_void_p),
        ("rstd", c_void_p),
        ("dx", c_void_p),
        ("dgamma", c_void_p),
        ("dbeta", c_void_p),
        ("timeout_ms", c_int),
        ("chunk_bytes", c_size_t),
        ("priority", c_uint32),
        ("max_queue_us", c_uint64),
    ]


class ParamsDesc(Structure):
    """lnorm_params_desc."""
    _fields_ = [
        ("id", c_char_p),
        ("dtype", c_int),
        ("hidden", c_uint64),
        ("gamma", c_void_p),
        ("beta", c_void_p),
    ]


class DeviceDesc(Structure):
    """lnorm_device_desc."""
    _fields_ = [
        ("backend", c_char * 16),
        ("name", c_char * 128),
        ("memory_bytes", c_uint64),
        ("index", c_uint32),
    ]


class ServerInfo(Structure):
    """lnorm_server_info."""
    _fields_ = [
        ("version", c_char * 64),
        ("nbackends", c_int),
        ("backends", (c_char * 16) * INFO_MAX_BACKENDS),
        ("ndevices", c_int),
        ("devices", DeviceDesc * INFO_MAX_DEVICES),
        ("max_message_bytes", c_uint64),
        ("max_rows", c_uint64),
        ("max_hidden", c_uint64),
        ("max_batch_rows", c_uint64),
        ("max_batch_bytes", c_uint64),
        ("max_queue_requests", c_uint64),
        ("max_params_bytes", c_uint64),
        ("max_inflight_bytes", c_uint64),
        ("shm", c_int),
    ]


# void (*lnorm_callback)(void *arg, int err, const lnorm_result *res)
CALLBACK = CFUNCTYPE(None, c_void_p, c_int, POINTER(Result))

_SIGNATURES = {
    "lnorm_client_version": (c_char_p, []),
    "lnorm_strerror": (c_char_p, [c_int]),
    "lnorm_errname": (c_char_p, [c_int]),
    "lnorm_client_opts_init": (None, [POINTER(ClientOpts)]),
    "lnorm_client_open": (c_int, [POINTER(c_void_p), POINTER(c_char_p), c_size_t, POINTER(ClientOpts)]),
    "lnorm_client_close": (None, [c_void_p]),
    "lnorm_normalize_req_init": (None, [POINTER(NormalizeReq), c_int, c_int, c_uint64, c_uint64]),
    "lnorm_normalize_req_check": (c_int, [POINTER(NormalizeReq), POINTER(c_char_p)]),
    "lnorm_normalize": (c_int, [c_void_p, POINTER(NormalizeReq), POINTER(Result)]),
    "lnorm_normalize_async": (c_int, [c_void_p, POINTER(NormalizeReq), CALLBACK, c_void_p]),
    "lnorm_normalize_backward_req_init": (None, [POINTER(NormalizeBackwardReq), c_int, c_int, c_uint64, c_uint64]),
    "lnorm_normalize_backward_req_check": (c_int, [POINTER(NormalizeBackwardReq), POINTER(c_char_p)]),
    "lnorm_normalize_backward": (c_int, [c_void_p, POINTER(NormalizeBackwardReq), POINTER(Result)]),
    "lnorm_normalize_backward_async": (c_int, [c_void_p, POINTER(NormalizeBackwardReq), CALLBACK, c_void_p]),
    "lnorm_register_params": (c_int, [c_void_p, POINTER(ParamsDesc), POINTER(Result)]),
    "lnorm_drop_params": (c_int, [c_void_p, c_char_p, POINTER(Result)]),
    "lnorm_health": (c_int, [c_void_p, POINTER(c_int), POINTER(Result)]),
    "lnorm_info": (c_int, [c_void_p, POINTER(ServerInfo), POINTER(Result)]),
}


def _candidates() -> list[str]:
    found = []
    env = os.environ.get("LNORM_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.startswith("liblnorm.so"):
            found.append(os.path.join(here, name))
    system = ctypes.util.find_library("lnorm")
    if system:
        found.append(system)
    found.append("liblnorm.so.0")
    return found


def _load() -> ctypes.CDLL:
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        return lib
    raise ImportError("lnorm: cannot load liblnorm (set LNORM_LIBRARY to the path of liblnorm.so): "
                      + "; ".join(errors))


lib = _load()
