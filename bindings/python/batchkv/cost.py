"""batchkv.cost - the library's built-in cost models.

    PolyCost       seed 000's polynomial (bkv_cost_poly), fields as attributes
    RooflineCost   seed 004's roofline (bkv_cost_roofline) from a preset
    CalibratedCost an online least-squares fit over a base model
                   (bkv_cost_calib)

Pass one as Scheduler(cost=...). The scheduler keeps a reference, so the model
outlives it, as the header requires. Changing a PolyCost or RooflineCost
attribute changes the model a scheduler uses (the C struct is shared).
Prediction calls (step_us, work) take a StepShape.
"""
import collections
import ctypes
import enum

import numpy as np

from . import _ffi
from ._native import _lib
from .errors import check
from .pool import _from_struct, _record

__all__ = ["CallKind", "StepShape", "PolyCost", "RooflineCost", "RooflinePreset",
           "CalibratedCost", "CalibConfidence"]

CalibConfidence = _record("CalibConfidence", _ffi.bkv_cost_calib_confidence,
                          "bkv_cost_calib_confidence: n_eff, scale_fit, scale_base, level, "
                          "trusted, uses_fit. Field meanings as in batchkv.h.")


class CallKind(enum.IntEnum):
    """bkv_call_kind: which host callback a batch or a shape is for."""
    MIXED = _ffi.BKV_CALL_MIXED
    PREFILL = _ffi.BKV_CALL_PREFILL
    DECODE = _ffi.BKV_CALL_DECODE


class RooflinePreset(enum.IntEnum):
    """bkv_roofline_preset: GPU/model pairs with spec-sheet figures."""
    A100_80GB_LLAMA2_13B_FP16 = _ffi.BKV_ROOFLINE_A100_80GB_LLAMA2_13B_FP16
    H100_SXM_LLAMA3_8B_BF16 = _ffi.BKV_ROOFLINE_H100_SXM_LLAMA3_8B_BF16
    A100_80GB_OPT_13B_FP16 = _ffi.BKV_ROOFLINE_A100_80GB_OPT_13B_FP16


StepShape = collections.namedtuple(
    "StepShape", "kind decode_rows decode_context chunks padded_rows group_decode_context",
    defaults=(CallKind.MIXED, 0, 0, (), 0, ()))
StepShape.__doc__ = ("bkv_step_shape: one host call to price. chunks is a sequence of "
                     "(len, start) prefill chunks; padded_rows >= decode_rows; "
                     "group_decode_context, per KV group, the context its decode rows "
                     "read (empty: one full-attention group).")


def _c_shape(shape):
    """(bkv_step_shape, keep-alive arrays) for a StepShape."""
    ctx = tuple(shape.group_decode_context)
    gctx = (ctypes.c_uint64 * max(len(ctx), 1))(*ctx)
    chunks = (_ffi.bkv_chunk_shape * max(len(shape.chunks), 1))()
    for i, (ln, st) in enumerate(shape.chunks):
        chunks[i].len, chunks[i].start = ln, st
    s = _ffi.bkv_step_shape()
    s.kind = int(shape.kind)
    s.decode_rows = shape.decode_rows
    s.decode_context = shape.decode_context
    s.n_chunks = len(shape.chunks)
    s.chunks = chunks
    s.padded_rows = max(shape.padded_rows, shape.decode_rows)
    s.n_groups = len(ctx)
    s.group_decode_context = gctx if ctx else None
    return s, (chunks, gctx)


class _StructModel:
    """A cost model backed by a C config struct whose fields are attributes."""

    def __getattr__(self, name):
        s = self.__dict__.get("_s")
        if s is not None and name in dict(type(s)._fields_) and name not in ("size", "reserved"):
            v = getattr(s, name)
            return v.decode() if isinstance(v, bytes) else v
        raise AttributeError(name)

    def __setattr__(self, name, value):
        s = self.__dict__.get("_s")
        if s is not None and name in dict(type(s)._fields_) and name not in ("size", "reserved",
                                                                             "name"):
            setattr(s, name, value)
        else:
            object.__setattr__(self, name, value)


class PolyCost(_StructModel):
    """Seed 000's polynomial model (bkv_cost_poly_init's coefficients, then
    any keyword overrides: a, b, c, kappa, rows_ref, packed, d0, d1, d2)."""

    def __init__(self, **fields):
        object.__setattr__(self, "_s", _ffi.bkv_cost_poly())
        _lib.bkv_cost_poly_init(ctypes.byref(self._s))
        for k, v in fields.items():
            if k not in dict(_ffi.bkv_cost_poly._fields_) or k in ("size", "reserved"):
                raise TypeError("PolyCost: unknown field %r" % k)
            setattr(self._s, k, v)

    def step_us(self, shape):
        """Predicted microseconds of one call (bkv_cost_poly_step_us)."""
        s, keep = _c_shape(shape)
        return _lib.bkv_cost_poly_step_us(ctypes.byref(self._s), ctypes.byref(s))

    def _model(self):
        return _lib.bkv_cost_poly_model(ctypes.byref(self._s))


class RooflineCost(_StructModel):
    """Seed 004's roofline for a preset pair (bkv_cost_roofline_init), then
    keyword overrides (flops_eff, mem_eff, overhead_us, ...). groups, a
    sequence of KvGroup, prices a hybrid model per KV group (the model keeps
    the C array alive; assigning groups replaces it)."""

    def __init__(self, preset=RooflinePreset.H100_SXM_LLAMA3_8B_BF16, **fields):
        object.__setattr__(self, "_s", _ffi.bkv_cost_roofline())
        object.__setattr__(self, "_groups", None)
        check(_lib.bkv_cost_roofline_init(ctypes.byref(self._s), int(preset)),
              "bkv_cost_roofline_init")
        for k, v in fields.items():
            if k not in dict(_ffi.bkv_cost_roofline._fields_) or k in ("size", "reserved", "name",
                                                                       "n_groups"):
                raise TypeError("RooflineCost: unknown field %r" % k)
            setattr(self, k, v)

    @property
    def groups(self):
        """The model's KV groups, a tuple of KvGroup (empty: all full)."""
        from .pool import KvGroup
        g = self._s.groups
        return tuple(KvGroup(g[i].kind, g[i].layers, g[i].span, g[i].bytes)
                     for i in range(self._s.n_groups))

    def __setattr__(self, name, value):
        if name == "groups":
            from .pool import _groups
            arr, n = _groups(value)
            object.__setattr__(self, "_groups", arr)
            self._s.groups = arr if n else None
            self._s.n_groups = n
        elif name == "n_groups":
            raise AttributeError("RooflineCost.n_groups follows groups")
        else:
            _StructModel.__setattr__(self, name, value)

    def step_us(self, shape):
        """Predicted microseconds of one call (bkv_cost_roofline_step_us)."""
        s, keep = _c_shape(shape)
        return _lib.bkv_cost_roofline_step_us(ctypes.byref(self._s), ctypes.byref(s))

    def work(self, shape):
        """(flops, bytes) the model counts for one call (bkv_cost_roofline_work)."""
        s, keep = _c_shape(shape)
        f, b = ctypes.c_double(), ctypes.c_double()
        _lib.bkv_cost_roofline_work(ctypes.byref(self._s), ctypes.byref(s), ctypes.byref(f),
                                    ctypes.byref(b))
        return f.value, b.value

    def _model(self):
        return _lib.bkv_cost_roofline_model(ctypes.byref(self._s))


class CalibratedCost:
    """An online least-squares fit over a base model (bkv_cost_calib_create).
    base: a PolyCost or RooflineCost (kept alive), or None to learn from zero.
    It belongs to one thread at a time: the stepping thread of the scheduler
    using it."""

    def __init__(self, base=None, forget=None):
        self._base = base
        self._base_model = base._model() if base is not None else None
        h = ctypes.c_void_p()
        check(_lib.bkv_cost_calib_create(
            ctypes.byref(self._base_model) if self._base_model is not None else None, None,
            ctypes.byref(h)), "bkv_cost_calib_create")
        self._h = h
        if forget is not None:
            self.set_forget(forget)

    def close(self):
        """Destroy the model (bkv_cost_calib_destroy); destroy its schedulers first."""
        if self._h:
            _lib.bkv_cost_calib_destroy(self._h)
            self._h = None

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()

    def set_forget(self, forget):
        """Forgetting factor in [0.9, 1] (bkv_cost_calib_set_forget)."""
        check(_lib.bkv_cost_calib_set_forget(self._h, float(forget)), "bkv_cost_calib_set_forget")

    def step_us(self, shape):
        """Predicted microseconds (bkv_cost_calib_step_us)."""
        s, keep = _c_shape(shape)
        return _lib.bkv_cost_calib_step_us(self._h, ctypes.byref(s))

    def observe(self, shape, measured_us):
        """Learn from one measured call (bkv_cost_calib_observe)."""
        s, keep = _c_shape(shape)
        _lib.bkv_cost_calib_observe(self._h, ctypes.byref(s), float(measured_us))

    def observations(self, kind):
        """Observations taken for a CallKind (bkv_cost_calib_observations)."""
        return _lib.bkv_cost_calib_observations(self._h, int(kind))

    def coefficients(self, kind):
        """The fitted coefficients of a CallKind, a float64 array of
        BKV_COST_CALIB_FEATURES (bkv_cost_calib_coefficients_get)."""
        w = np.zeros(_ffi.BKV_COST_CALIB_FEATURES, np.float64)
        check(_lib.bkv_cost_calib_coefficients_get(self._h, int(kind),
                                               w.ctypes.data_as(ctypes.POINTER(ctypes.c_double))),
              "bkv_cost_calib_coefficients_get")
        return w

    def confidence(self, kind):
        """CalibConfidence of a CallKind: how much its fit knows and whether
        predictions use it (bkv_cost_calib_confidence_get)."""
        c = _ffi.bkv_cost_calib_confidence()
        c.size = ctypes.sizeof(c)
        check(_lib.bkv_cost_calib_confidence_get(self._h, int(kind), ctypes.byref(c)),
              "bkv_cost_calib_confidence_get")
        return _from_struct(CalibConfidence, c)

    def _model(self):
        return _lib.bkv_cost_calib_model(self._h)
