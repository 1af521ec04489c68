"""liblnorm_cuda_bench.so through ctypes, for the Python benchmarks and profiling
drivers (bench/kernels.py, bench/gpu/ncu_kernels.py, bench/gpu/ncu_peers.py).

load_lib(path) binds the entry points they call and gives the library a
workspace (lib.ws) for the one stream every launch runs on, as lnormd's backend
has one per slot: the long-row kernels take dynamic tiles from it.
"""
import ctypes


def load_lib(path):
    """The library at path with lnorm_cuda_norm, _ws_create, _tier, _stat and
    _set_tuning bound, and lib.ws created."""
    lib = ctypes.CDLL(path)
    f = lib.lnorm_cuda_norm
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_int] * 4 + [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 8 + \
        [ctypes.c_float, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.lnorm_cuda_ws_create.restype = ctypes.c_int
    lib.lnorm_cuda_ws_create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.ws = ctypes.c_void_p()
    if lib.lnorm_cuda_ws_create(ctypes.byref(lib.ws), 1) != 0:
        raise SystemExit(f"{path}: lnorm_cuda_ws_create failed")
    lib.lnorm_cuda_stat.restype = ctypes.c_long
    lib.lnorm_cuda_stat.argtypes = [ctypes.c_char_p]
    lib.lnorm_cuda_set_tuning.restype = ctypes.c_int
    lib.lnorm_cuda_set_tuning.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.lnorm_cuda_tier.restype = ctypes.c_int
    lib.lnorm_cuda_tier.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.POINTER(ctypes.c_char_p)]
    return lib
