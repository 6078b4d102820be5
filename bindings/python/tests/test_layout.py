"""Every ctypes Structure of batchkv._ffi against the C compiler's layout:
size, alignment, and each field's offset and size, as bindings/layout.c
prints them (built by meson as bkv_layout; $BKV_LAYOUT_EXE)."""
import ctypes
import os
import subprocess

import pytest

from batchkv import _ffi


def c_layout():
    exe = os.environ.get("BKV_LAYOUT_EXE")
    if not exe:
        pytest.skip("BKV_LAYOUT_EXE not set (meson test sets it)")
    structs, fields = {}, {}
    for line in subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split("\n"):
        w = line.split()
        if not w:
            continue
        if w[0] == "S":
            structs[w[1]] = (int(w[2]), int(w[3]))
        else:
            fields[(w[1], w[2])] = (int(w[3]), int(w[4]))
    return structs, fields


def test_every_struct_matches_the_c_layout():
    structs, fields = c_layout()
    assert len(structs) >= 19
    seen = 0
    for name, (size, align) in structs.items():
        cls = getattr(_ffi, name)
        assert (ctypes.sizeof(cls), ctypes.alignment(cls)) == (size, align), name
        for f, _ in cls._fields_:
            d = getattr(cls, f)
            assert (d.offset, d.size) == fields[(name, f)], "%s.%s" % (name, f)
            seen += 1
    assert seen == len(fields)
