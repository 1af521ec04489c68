"""The ctypes structures of the package against the C compiler's layout of
include/lnorm/lnorm.h (printed by the program layout.c): every field the C
struct has sits at the same offset, and the sizes are equal, so a field
added to or moved in the header fails here until _lib.py follows."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess

from lnorm import _lib

STRUCTS = {"lnorm_client_opts": _lib.ClientOpts, "lnorm_result": _lib.Result,
           "lnorm_normalize_req": _lib.NormalizeReq, "lnorm_params_desc": _lib.ParamsDesc,
           "lnorm_normalize_backward_req": _lib.NormalizeBackwardReq,
           "lnorm_device_desc": _lib.DeviceDesc, "lnorm_server_info": _lib.ServerInfo}


def test_layout_matches_header():
    c = json.loads(subprocess.run([os.environ["LNORM_PY_LAYOUT"]], check=True, capture_output=True,
                                  text=True).stdout)
    assert set(c) == set(STRUCTS)
    for name, cls in STRUCTS.items():
        py_fields = [f[0] for f in cls._fields_]
        assert list(c[name]["fields"]) == py_fields, name
        for field, off in c[name]["fields"].items():
            assert getattr(cls, field).offset == off, f"{name}.{field}: ctypes {getattr(cls, field).offset}, C {off}"
        assert ctypes.sizeof(cls) == c[name]["size"], f"sizeof({name})"

