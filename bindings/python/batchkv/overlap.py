"""batchkv.overlap - overlapped scheduling's placeholders (Scheduler(overlap=N)).

A token id in a launched batch's token_ids may be a placeholder
(BKV_TOKEN_PENDING_AT in batchkv.h): it stands for the token that the step
launched `back` launches before samples for its row i (back 1..N; 1 = the
previous launch). The host replaces it on the device before computing; these
helpers decode it and resolve it from the earlier steps' sampled tokens.
They work on ints and, elementwise, on numpy integer arrays.
"""
import numpy as np

from . import _ffi

__all__ = ["OVERLAP_MAX_DEPTH", "token_pending_at", "token_is_pending", "token_pending_back",
           "token_pending_row", "resolve_placeholders"]

OVERLAP_MAX_DEPTH = _ffi.BKV_OVERLAP_MAX_DEPTH  # Scheduler(overlap=N): N at most this


def token_pending_at(back, i):
    """The placeholder for row i of the step launched back launches before
    (BKV_TOKEN_PENDING_AT): -2 - ((back - 1) << 18 | i)."""
    return -2 - (((back - 1) << 18) | i)


def token_is_pending(t):
    """Whether token id t is a placeholder (BKV_TOKEN_IS_PENDING)."""
    return (t <= -2) & (t > -2 - OVERLAP_MAX_DEPTH * _ffi.BKV_TOKEN_PENDING_ROWS)


def token_pending_back(t):
    """How many launches back a placeholder's step is (BKV_TOKEN_PENDING_BACK)."""
    return ((-2 - t) >> 18) + 1


def token_pending_row(t):
    """The row a placeholder names in its step (BKV_TOKEN_PENDING_ROW)."""
    return (-2 - t) & (_ffi.BKV_TOKEN_PENDING_ROWS - 1)


def resolve_placeholders(token_ids, recent):
    """A copy of token_ids (a launched batch's, or any int array) with each
    placeholder replaced by the token it stands for: recent[back - 1] is the
    next_tokens array of the step launched back launches before this one
    (recent[0] the previous launch's), as the device keeps them. IndexError
    when a placeholder names a step recent does not hold or a row beyond
    its tokens."""
    ids = np.array(token_ids, dtype=np.int32, copy=True)
    at = np.nonzero(token_is_pending(ids))[0]
    if at.size == 0:
        return ids
    back = token_pending_back(ids[at].astype(np.int64))
    row = token_pending_row(ids[at].astype(np.int64))
    for k in np.unique(back):
        if k > len(recent):
            raise IndexError("a placeholder names the step %d launches back; %d held"
                             % (k, len(recent)))
        sel = back == k
        ids[at[sel]] = np.asarray(recent[k - 1], dtype=np.int32)[row[sel]]
    return ids
