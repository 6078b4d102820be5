"""batchkv.errors - one exception class per bkv_status code.

Every call of the package that the C library can refuse raises a subclass of
BkvError named after the status; `err.status` is the negative code and
`str(err)` the C function that failed, the library's bkv_strerror() text and,
when the call left one, its bkv_last_error() message naming the refused field
("bkv_pool_create: invalid argument: bkv_pool_config.block_tokens = 24: must
be a power of two in 1..65536"). The
classes also derive from the closest built-in exception, so code that catches
MemoryError, LookupError or ValueError keeps working:

    status         class                 also a
    BKV_EINVAL     InvalidArgumentError  ValueError
    BKV_ENOMEM     OutOfMemoryError      MemoryError
    BKV_ENOSPC     NoSpaceError          -     (no free KV blocks: normal)
    BKV_E2BIG      TooBigError           ValueError
    BKV_EAGAIN     TryAgainError         -     (a limit; retry later)
    BKV_ENOENT     NotFoundError         LookupError
    BKV_EHOST      HostError             -     (a host callback failed)
    BKV_ESTATE     StateError            RuntimeError
"""
from . import _ffi
from ._native import _lib


class BkvError(Exception):
    """A libbatchkv call failed. `status` is the bkv_status code (< 0)."""

    status = None

    def __init__(self, message, status=None):
        if status is not None:
            self.status = status
        super().__init__(message)


class InvalidArgumentError(BkvError, ValueError):
    """BKV_EINVAL: an argument or config field out of range (misuse)."""
    status = _ffi.BKV_EINVAL


class OutOfMemoryError(BkvError, MemoryError):
    """BKV_ENOMEM: the allocator failed."""
    status = _ffi.BKV_ENOMEM


class NoSpaceError(BkvError):
    """BKV_ENOSPC: not enough free KV blocks (a normal event: reclaim,
    preempt or wait)."""
    status = _ffi.BKV_ENOSPC


class TooBigError(BkvError, ValueError):
    """BKV_E2BIG: it can never fit (the pool, max_running, max_seqs), or a
    caller array is too small."""
    status = _ffi.BKV_E2BIG


class TryAgainError(BkvError):
    """BKV_EAGAIN: a limit was reached (max_seqs, max_queue); try later."""
    status = _ffi.BKV_EAGAIN


class NotFoundError(BkvError, LookupError):
    """BKV_ENOENT: no such sequence or request (or it already ended)."""
    status = _ffi.BKV_ENOENT


class HostError(BkvError):
    """BKV_EHOST: a host compute callback failed; the step was rolled back.
    When the callback raised, step() re-raises that exception instead."""
    status = _ffi.BKV_EHOST


class StateError(BkvError, RuntimeError):
    """BKV_ESTATE: the call is not allowed now (swapped sequence, bkv_step
    from a callback, a pool used during its scheduler's step, ...)."""
    status = _ffi.BKV_ESTATE


ERRORS = {c.status: c for c in (InvalidArgumentError, OutOfMemoryError, NoSpaceError,
                                 TooBigError, TryAgainError, NotFoundError, HostError,
                                 StateError)}


def strerror(status):
    """bkv_strerror(): the library's message for a status code (any int)."""
    return _lib.bkv_strerror(int(status)).decode()


def last_error():
    """bkv_last_error(): this thread's message for the last refused config
    or request ("" when there is none)."""
    return _lib.bkv_last_error().decode(errors="replace")


# The calls that leave a bkv_last_error() message when they refuse an
# argument (include/batchkv.h, bkv_last_error); every other call leaves the
# message of an earlier one, so only these read it.
NAMING_CALLS = frozenset(("bkv_pool_create", "bkv_sched_create", "bkv_submit",
                          "bkv_cost_calib_create", "bkv_cost_roofline_init",
                          "bkv_vllm_encoder_create", "bkv_sched_kv_release"))


def error(status, what):
    """The exception for a negative status (BkvError for an unknown one).
    what is the C function that failed; when it is one of NAMING_CALLS,
    call this right after it, on its thread: the text then carries the
    library's bkv_last_error() message (the field and the rule)."""
    cls = ERRORS.get(status, BkvError)
    detail = last_error() if what in NAMING_CALLS else ""
    if detail:
        return cls("%s: %s: %s" % (what, strerror(status), detail), status)
    return cls("%s: %s" % (what, strerror(status)), status)


def check(status, what):
    """Raise the status's exception when status < 0; else return it."""
    if status < 0:
        raise error(status, what)
    return status
