"""batchkv._native - the loaded shared library, declared (see _ffi.load)."""
from . import _ffi

_lib = _ffi.load()
