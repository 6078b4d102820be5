"""batchkv.sched - the scheduler (bkv_sched), the host callbacks and the batch.

A Scheduler runs one transaction per step(): admit, plan, make room, build the
batch, call the host, commit. The host is any Python object with either

    forward(batch, next_tokens)              mixed batches, or
    prefill(batch, next_tokens) and
    decode(batch, next_tokens)               split kernels

and optionally on_token(req, branch, token, user), on_finish(req, reason,
user) and now_us() (a clock in microseconds). A compute method returns None
(or 0) on success; a negative int fails the call without an exception.

THE BATCH IS BORROWED. A Batch's arrays (token_ids, positions, qo_indptr,
kv_indptr, kv_indices, kv_last_page_len, slot_mapping, row_sample, row_req,
row_branch, copies, swap_out, swap_in, row_slot, row_adapter, adapters,
encode, encoder_free, and those of each BatchGroup in Batch.groups) are
zero-copy numpy views of the library's buffers, read-only, and next_tokens
is a writable view of the library's output array. They are valid only while
the callback runs: the next step reuses the memory. Copy (np.array(view))
anything kept.

EXCEPTIONS. An exception raised by forward/prefill/decode makes that host call
fail (BKV_EHOST): the step is rolled back (no token reached any request, every
sequence is back at its length) and step() re-raises the same exception; the
next step() retries, so no request is lost. An exception raised by on_token or
on_finish cannot roll anything back (the step has committed); it is re-raised
by step() after the step completed, and the token or finish it was told about
stands. If several callbacks raise in one step, the first is raised.

THREADS. submit(), abort(), xfer_done() and pending may be called from any
Python thread while another thread runs step(): the library calls are made
with the GIL released, and the callbacks (which take the GIL back) never run
under the library's lock, so the two never deadlock. Everything else belongs
to the stepping thread, between steps.
"""
import collections
import ctypes
import enum
import itertools
import threading

import numpy as np

from . import _ffi
from ._native import _lib
from .errors import StateError, check, error
from .pool import GroupKind, _fill, _from_struct, _i32, _record

__all__ = ["Scheduler", "Batch", "BatchGroup", "BatchLayout", "Policy", "Preempt", "FinishReason",
           "StepInfo", "SchedStats", "TOKEN_FAIL", "adapter_cache_key", "encoder_token",
           "ENCODE_DTYPE", "XFER_BLOCK_DTYPE", "CONNECTOR_LATER"]

TOKEN_FAIL = _ffi.BKV_TOKEN_FAIL  # write it into next_tokens[r] to fail row r's request


def adapter_cache_key(cache_key, adapter):
    """The prefix-cache key a request's blocks are cached under
    (bkv_adapter_cache_key): cache_key when adapter is 0, else a 64-bit mix
    of both that is never 0. Pass it to Pool.open(key=...) or
    Pool.pin_prefix(key=...) to reach a request's blocks."""
    return _lib.bkv_adapter_cache_key(int(cache_key), int(adapter))


def encoder_token(cache_id, i):
    """The token id the library puts at position i of an encoder input's
    span (bkv_encoder_token): at most -2**23 (below TOKEN_FAIL and every
    overlap placeholder), a function of (cache_id, i) alone. A batch's
    token_ids carry it at the positions of a request's inputs, whatever the
    submitted prompt held there."""
    return _lib.bkv_encoder_token(int(cache_id), int(i))


# bkv_encode as a numpy structured dtype: fields cache_id, req, user (uint64;
# user is the request's user pointer as an address, not the Python object),
# input, len (uint32); Batch.encode is a read-only array of it.
ENCODE_DTYPE = np.dtype(_ffi.bkv_encode)

# bkv_kv_xfer_block as a numpy structured dtype: fields hash (uint64), index,
# group (uint32), block (int32), frames (uint32); a connector's load and save
# receive a read-only array of it (a copy: keep it as long as needed).
XFER_BLOCK_DTYPE = np.dtype(_ffi.bkv_kv_xfer_block)

CONNECTOR_LATER = _ffi.BKV_CONNECTOR_LATER  # lookup's answer: ask again at a later step


class Policy(enum.IntEnum):
    """bkv_policy."""
    CONTINUOUS = _ffi.BKV_POLICY_CONTINUOUS
    STATIC = _ffi.BKV_POLICY_STATIC


class Preempt(enum.IntEnum):
    """bkv_preempt_mode."""
    AUTO = _ffi.BKV_PREEMPT_AUTO
    RECOMPUTE = _ffi.BKV_PREEMPT_RECOMPUTE
    SWAP = _ffi.BKV_PREEMPT_SWAP


class BatchLayout(enum.IntEnum):
    """bkv_batch_layout: how a batch carries the rows' block tables
    (Scheduler(batch_layout=...))."""
    FLAT = _ffi.BKV_BATCH_FLAT              # kv_indptr / kv_indices every call
    PERSISTENT = _ffi.BKV_BATCH_PERSISTENT  # row slots, their tables, deltas


class FinishReason(enum.IntEnum):
    """bkv_finish_reason: why a request ended."""
    LENGTH = _ffi.BKV_FINISH_LENGTH
    STOP = _ffi.BKV_FINISH_STOP
    ABORT = _ffi.BKV_FINISH_ABORT
    ERROR = _ffi.BKV_FINISH_ERROR


StepInfo = _record("StepInfo", _ffi.bkv_step_info, "bkv_step_info: what one step did.")
SchedStats = _record("SchedStats", _ffi.bkv_sched_stats,
                     "bkv_sched_stats: the scheduler's cumulative counters.")
StepOutputs = collections.namedtuple("StepOutputs", "token_req token_branch token_ids "
                                     "finished_req finished_reason")
StepOutputs.__doc__ = ("bkv_step_outputs: what a step delivered, as read-only numpy arrays: "
                       "token_req (uint64), token_branch (uint32), token_ids (int32) per token, "
                       "finished_req (uint64), finished_reason (int32, FinishReason) per ended "
                       "request; views valid until the next step (copy to keep).")


class _OutsWords(ctypes.Structure):
    """bkv_step_outputs with its pointers as plain addresses (cheaper to read
    than ctypes pointer objects; the same layout)."""
    _fields_ = [(f, ctypes.c_void_p if t is not ctypes.c_uint32 else t)
                for f, t in _ffi.bkv_step_outputs._fields_]

_I32 = ctypes.c_int32
# Pointer fields of bkv_batch by word index, read from a word view of the struct.
_WORD = ctypes.sizeof(ctypes.c_size_t)
_PTR = {f: getattr(_ffi.bkv_batch, f).offset // _WORD for f, t in _ffi.bkv_batch._fields_
        if getattr(_ffi.bkv_batch, f).offset % _WORD == 0}
_WORDS = ctypes.c_size_t * (ctypes.sizeof(_ffi.bkv_batch) // _WORD)
# The same for bkv_batch_group, one element of bkv_batch.groups.
_GPTR = {f: getattr(_ffi.bkv_batch_group, f).offset // _WORD
         for f, t in _ffi.bkv_batch_group._fields_ if t is not ctypes.c_uint32}
_GSIZE = ctypes.sizeof(_ffi.bkv_batch_group)
_GWORDS = ctypes.c_size_t * (_GSIZE // _WORD)
# The compute callbacks are made with plain-address arguments (cheaper than
# ctypes pointer objects) and cast to bkv_host_ops' prototype: same C ABI.
_COMPUTE_RAW = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def _empty(dtype, shape=(0,)):
    a = np.zeros(shape, dtype)
    a.flags.writeable = False
    return a


_EMPTY = {np.dtype(d): _empty(d) for d in (np.int32, np.uint8, np.uint32, np.uint64,
                                            ENCODE_DTYPE, XFER_BLOCK_DTYPE)}
_NO_DELTAS = _empty(np.uint32, (0, 5))
_NO_COPIES = _empty(np.int32, (0, 2))


class _Views:
    """A scheduler's cache of numpy views over the library's batch buffers.

    The scheduler reuses its batch arrays from step to step (they only move
    when they grow), so a view made once at an address serves every later
    call whose array starts there and needs no more elements: view[:n] is a slice
    instead of a new buffer object. A view is made of exactly the n elements
    valid at the time, so no slice ever covers memory the library did not
    hand over in that call."""

    __slots__ = ("cache",)

    def __init__(self):
        self.cache = {}

    def get(self, key, addr, n, ctype, dtype, writable=False):
        c = self.cache.get(key)
        if c is not None and c[0] == addr and len(c[1]) >= n:
            return c[1][:n]
        if not n or not addr:
            return _EMPTY[np.dtype(dtype)] if not writable else np.zeros(0, dtype)
        v = np.frombuffer((ctype * n).from_address(addr), dtype=dtype)
        if not writable:
            v.flags.writeable = False
        self.cache[key] = (addr, v)
        return v


class Batch:
    """One host call's work (bkv_batch), as zero-copy numpy views that are
    valid only during the callback (see the module's doc). Scalars: kind
    (CallKind), n_rows, n_decode_rows (rows [0, n_decode_rows) decode one
    token each; the rest are prefill chunks), n_tokens, block_tokens.
    Arrays (read-only views, created on first access): token_ids, positions,
    slot_mapping [n_tokens]; qo_indptr, kv_indptr [n_rows+1]; kv_indices;
    kv_last_page_len, row_sample (uint8), row_req (uint64), row_branch
    (uint32) [n_rows]; copies, swap_out, swap_in ((n, 2) int32 src, dst:
    perform swap_out, swap_in, copies in that order before computing).
    users: the user objects of the rows' requests (a list). layout
    (BatchLayout), n_row_slots, row_slot [n_rows] (uint32; persistent:
    each row's row slot, else empty), table_deltas and delta_blocks
    (persistent: the changes to the host's copy of the slots' tables).
    n_groups and groups: the pool's KV groups (a list of BatchGroup; one,
    group 0, for a pool without groups); groups[0] is the arrays above.
    Speculative decoding (Scheduler(spec_max_k=K)): n_spec_rows, row_drafts
    [n_rows] (uint32: a decode row with k drafts carries 1 + k tokens),
    spec_tokens (writable int32, indexed like token_ids over the decode
    rows: the token sampled after each of a drafted row's tokens) and
    n_accepted (writable int32 [n_rows]: the drafts accepted, or -1 for the
    library's greedy rule); a drafted row's next_tokens entry is not read.
    Adapters (Scheduler(max_adapters=N)): row_adapter [n_rows] (uint32: the
    adapter of each row's request, 0 for none; empty without max_adapters),
    n_adapters and adapters [n_adapters] (uint32: the call's distinct
    nonzero adapters, at most max_adapters, in the order of their first
    row: the host has each loaded for the call).
    Encoder inputs (Scheduler(encoder_cache=N)): n_encoder_free and
    encoder_free [n_encoder_free] (uint64: cache ids whose outputs the host
    drops first; ids it does not hold are ignored), then n_encode and
    encode [n_encode] (ENCODE_DTYPE records: cache_id, req, user, input, len; the
    host runs the encoder on input `input` of request `req` and caches its
    len outputs under cache_id). A row reads the outputs of every input of
    its request whose span it covers; they are cached by then (this call
    or an earlier one), and token_ids there are encoder_token(cache_id, i).
    Empty without encoder_cache."""

    __slots__ = ("_words", "_raw", "_sched", "_views", "_groups", "kind", "n_rows",
                 "n_decode_rows", "n_tokens", "block_tokens")

    def __init__(self, raw, words, sched):
        self._raw = raw
        self._words = words
        self._sched = sched
        self._views = sched._views
        self.kind = raw.kind
        self.n_rows = raw.n_rows
        self.n_decode_rows = raw.n_decode_rows
        self.n_tokens = raw.n_tokens
        self.block_tokens = raw.block_tokens
        self._groups = None

    def _ptr(self, field):
        return self._words[_PTR[field]]

    def _view(self, field, n, ctype, dtype):
        return self._views.get((field, self.kind), self._ptr(field), n, ctype, dtype)

    @property
    def token_ids(self):
        return self._view("token_ids", self.n_tokens, _I32, np.int32)

    @property
    def positions(self):
        return self._view("positions", self.n_tokens, _I32, np.int32)

    @property
    def slot_mapping(self):
        return self._view("slot_mapping", self.n_tokens, _I32, np.int32)

    @property
    def qo_indptr(self):
        return self._view("qo_indptr", self.n_rows + 1, _I32, np.int32)

    @property
    def kv_indptr(self):
        return self._view("kv_indptr", self.n_rows + 1, _I32, np.int32)

    @property
    def kv_indices(self):
        n = int(self.kv_indptr[self.n_rows]) if self.n_rows else 0
        return self._view("kv_indices", n, _I32, np.int32)

    @property
    def kv_last_page_len(self):
        return self._view("kv_last_page_len", self.n_rows, _I32, np.int32)

    @property
    def row_sample(self):
        return self._view("row_sample", self.n_rows, ctypes.c_uint8, np.uint8)

    @property
    def row_req(self):
        return self._view("row_req", self.n_rows, ctypes.c_uint64, np.uint64)

    @property
    def row_branch(self):
        return self._view("row_branch", self.n_rows, ctypes.c_uint32, np.uint32)

    def _copies(self, field, count):
        n = getattr(self._raw, count)
        if not n:
            return _NO_COPIES
        return self._views.get((field, self.kind), self._ptr(field), 2 * n, _I32,
                               np.int32).reshape(n, 2)

    @property
    def copies(self):
        return self._copies("copies", "n_copies")

    @property
    def swap_out(self):
        return self._copies("swap_out", "n_swap_out")

    @property
    def swap_in(self):
        return self._copies("swap_in", "n_swap_in")

    @property
    def table_deltas(self):
        """Persistent layout: the changes to apply to the host's copy of the
        row slots' tables, in order, as a read-only (n, 5) uint32 view of
        bkv_table_delta (columns slot, start, n, len, flags); delta n writes
        the next n entries of delta_blocks at [start, start + n) of slot's
        table, which then has len entries. Empty in the flat layout."""
        n = self._raw.n_table_deltas
        if not n:
            return _NO_DELTAS
        return self._views.get(("table_deltas", self.kind), self._ptr("table_deltas"), 5 * n,
                               ctypes.c_uint32, np.uint32).reshape(n, 5)

    @property
    def delta_blocks(self):
        """Persistent layout: the block ids the table deltas write, in delta
        order (read-only int32)."""
        d = self.table_deltas
        n = int(d[:, 2].sum()) if len(d) else 0
        return self._view("delta_blocks", n, _I32, np.int32)

    @property
    def n_spec_rows(self):
        return self._raw.n_spec_rows

    @property
    def row_drafts(self):
        return self._view("row_drafts", self.n_rows, ctypes.c_uint32, np.uint32)

    @property
    def spec_tokens(self):
        n = int(self.qo_indptr[self.n_decode_rows]) if self.n_decode_rows else 0
        return self._views.get(("spec_tokens", self.kind), self._ptr("spec_tokens"), n, _I32,
                               np.int32, writable=True)

    @property
    def n_accepted(self):
        return self._views.get(("n_accepted", self.kind), self._ptr("n_accepted"), self.n_rows,
                               _I32, np.int32, writable=True)

    @property
    def row_adapter(self):
        return self._view("row_adapter", self.n_rows, ctypes.c_uint32, np.uint32)

    @property
    def n_adapters(self):
        return self._raw.n_adapters

    @property
    def adapters(self):
        return self._view("adapters", self._raw.n_adapters, ctypes.c_uint32, np.uint32)

    @property
    def n_encode(self):
        return self._raw.n_encode

    @property
    def encode(self):
        return self._views.get(("encode", self.kind), self._ptr("encode"), self._raw.n_encode,
                               _ffi.bkv_encode, ENCODE_DTYPE)

    @property
    def n_encoder_free(self):
        return self._raw.n_encoder_free

    @property
    def encoder_free(self):
        return self._view("encoder_free", self._raw.n_encoder_free, ctypes.c_uint64, np.uint64)

    @property
    def layout(self):
        return BatchLayout(self._raw.layout)

    @property
    def n_row_slots(self):
        return self._raw.n_row_slots

    @property
    def row_slot(self):
        return self._view("row_slot", self.n_rows, ctypes.c_uint32, np.uint32)

    @property
    def n_groups(self):
        return self._raw.n_groups

    @property
    def groups(self):
        if self._groups is None:
            p = self._ptr("groups")
            if p:
                self._groups = [BatchGroup(self, g, _GWORDS.from_address(p + g * _GSIZE))
                                for g in range(self._raw.n_groups)]
            else:  # a pool without groups: group 0 is the batch's own arrays
                self._groups = [BatchGroup(self, 0, None)]
        return self._groups

    @property
    def users(self):
        p = self._ptr("row_user")
        if not self.n_rows or not p:
            return []
        ptrs = (ctypes.c_void_p * self.n_rows).from_address(p)
        get = self._sched._users.get
        return [get(u) for u in ptrs]


class BatchGroup:
    """One KV group's part of a host call (bkv_batch_group), borrowed like
    the Batch it came from. Every group computes the batch's tokens at the
    batch's positions; what differs is where its K/V lives. Scalars: index
    (in the pool's groups), kind (GroupKind), span (window or chunk, 0 for
    FULL). Arrays (read-only views, created on first access; empty where
    the library gives none): slot_mapping [n_tokens], where each new token's
    K/V goes in this group; flat layout: kv_indptr [n_rows+1], kv_indices
    (row r's blocks in this group are kv_indices[kv_indptr[r]:kv_indptr[r+1]],
    from its first block read on: a window or chunked group lists only the
    blocks the row's tokens read) and kv_first_block [n_rows] (the logical
    index of each row's first entry; empty for group 0 of a pool without
    groups, whose rows all start at block 0); persistent layout:
    row_table_len [n_row_slots] and row_table(slot), this group's table of
    a slot of one of the call's rows (-1 where a window released a block).
    A STATE group (recurrent state) has no slots or tables; instead
    state_in and state_out [n_rows], the first frame of the unit each row
    reads its initial state from (-1: the zero state, the row starts at
    position 0) and of the unit it writes its state after its last token
    to, and state_frames, the consecutive frames of a unit; with drafts,
    state_out_spec (the unit after each decode token). state_in, state_out
    and state_out_spec are None for attention groups, state_frames 0."""

    __slots__ = ("_b", "_words", "index", "kind", "span", "state_frames")

    def __init__(self, batch, index, words):
        self._b = batch
        self._words = words
        self.index = index
        if words is None:
            self.kind, self.span, self.state_frames = GroupKind.FULL, 0, 0
        else:
            g = _ffi.bkv_batch_group.from_address(ctypes.addressof(words))
            self.kind, self.span = GroupKind(g.kind), g.span
            self.state_frames = g.state_frames

    def _ptr(self, field):
        if self._words is None:  # no groups array: the batch's own
            return 0 if field == "kv_first_block" else self._b._ptr(field)
        return self._words[_GPTR[field]]

    def _view(self, field, n, ctype, dtype):
        b = self._b
        return b._views.get((field, b.kind, self.index), self._ptr(field), n, ctype, dtype)

    @property
    def slot_mapping(self):
        return self._view("slot_mapping", self._b.n_tokens, _I32, np.int32)

    @property
    def kv_indptr(self):
        return self._view("kv_indptr", self._b.n_rows + 1, _I32, np.int32)

    @property
    def kv_indices(self):
        ip = self.kv_indptr
        n = int(ip[self._b.n_rows]) if len(ip) else 0
        return self._view("kv_indices", n, _I32, np.int32)

    @property
    def kv_first_block(self):
        return self._view("kv_first_block", self._b.n_rows, _I32, np.int32)

    @property
    def row_table_len(self):
        return self._view("row_table_len", self._b.n_row_slots, ctypes.c_uint32, np.uint32)

    @property
    def state_in(self):
        if self.kind != GroupKind.STATE:
            return None
        return self._view("state_in", self._b.n_rows, _I32, np.int32)

    @property
    def state_out(self):
        if self.kind != GroupKind.STATE:
            return None
        return self._view("state_out", self._b.n_rows, _I32, np.int32)

    @property
    def state_out_spec(self):
        """STATE with speculation: indexed like the decode rows' tokens, the
        first frame of the unit the host writes the state after each token
        to (a row with k drafts: its tokens 0..k; a row without: its
        state_out). The commit keeps the state after the last delivered
        token. None when the call has no draft, and for other groups."""
        if self.kind != GroupKind.STATE or not self._ptr("state_out_spec"):
            return None
        n = int(self._b.qo_indptr[self._b.n_decode_rows])
        return self._view("state_out_spec", n, _I32, np.int32)

    def row_table(self, slot):
        """This group's block table of row slot `slot` (persistent layout;
        valid for the slots of the call's rows), a read-only int32 view;
        empty in the flat layout. IndexError for a slot >= n_row_slots."""
        tables = self._ptr("row_tables")
        if not tables:
            return _EMPTY[np.dtype(np.int32)]
        if not 0 <= slot < self._b.n_row_slots:
            raise IndexError("BatchGroup.row_table: slot %d of %d" % (slot, self._b.n_row_slots))
        n = int(self.row_table_len[slot])
        p = ctypes.c_void_p.from_address(tables + slot * _WORD).value
        if not n or not p:
            return _EMPTY[np.dtype(np.int32)]
        v = np.frombuffer((_I32 * n).from_address(p), dtype=np.int32)
        v.flags.writeable = False
        return v


class Scheduler:
    """A scheduler over a Pool (bkv_sched_create), driving `host`.

    Keyword arguments are bkv_sched_config fields (policy, max_running,
    admit_group, max_wait_us, chunked_prefill, token_budget, max_queue,
    preempt, host_link_bytes_per_us, kv_bytes_per_token, tpot_target_us,
    max_bypass_us, ttft_target_us, evict: BKV_EVICT_SEGMENTED (the default), BKV_EVICT_LRU or BKV_EVICT_VALUE, victim: BKV_VICTIM_RECENT or BKV_VICTIM_COST, admit_reserve: BKV_RESERVE_PROMPT or BKV_RESERVE_OUTPUT, max_adapters: the most distinct adapters among the running requests, so in any call, adapter_wait_us: the bound on passing a request whose adapter has no room, encoder_cache: the host's encoder cache in tokens (0: no encoder inputs), encoder_budget: encoder work per step in the inputs' cost unit (0: no bound)); unset ones keep bkv_sched_config_init's defaults. cost:
    a PolyCost, RooflineCost or CalibratedCost (default: the library's
    calibrated seed 000 model). The pool must not be used by anyone else
    while the scheduler lives (its methods are refused during a step).

    outputs=True records each step's outputs as arrays (outputs(): a host
    needs no on_token, one crossing per step instead of one per token).

    connector=obj plugs in a KV connector (bkv_sched_config.connector; the
    pool needs its prefix cache), an external store of KV blocks keyed by
    their chained hashes. obj has lookup(req, hashes) -> how many of the
    leading hashes (a uint64 array) the store holds, or CONNECTOR_LATER to
    be asked again at a later step; load(xfer, req, blocks) and, optionally,
    save(xfer, blocks), which start a transfer of blocks (a read-only
    XFER_BLOCK_DTYPE array: hash, index, group, device block, frames) and
    return None (started) or a negative int (not started: loads are
    recomputed, saves released); optionally preempted(req); optionally
    contains(hash) -> bool, whether the store holds the block of that
    chained hash (a pool with KV groups then ends a load where every
    group's blocks are held; absent: NULL, loads end where lookup said and a
    group's missing block fails the load); optionally the
    ints save_blocks and max_saves (0: the library's 256 and 64). Each
    transfer completes by xfer_done(xfer, ...), from any thread, also from
    inside load/save. The callbacks run on the stepping thread inside
    step(); an exception in one counts as a failed lookup (0 blocks), a
    transfer not started or a block not held (contains), and is re-raised
    by step() after the step.
    The connector and its C callbacks live as long as the scheduler.

    Raises InvalidArgumentError (a field out of range), TypeError (a host
    with neither forward nor both prefill and decode), OutOfMemoryError.

    Use it as a context manager or call close(): its C callbacks refer back
    to it, so an unclosed scheduler is only freed by the cyclic garbage
    collector.
    """

    def __init__(self, pool, host, cost=None, outputs=False, **config):
        cfg = _ffi.bkv_sched_config()
        _lib.bkv_sched_config_init(ctypes.byref(cfg))
        connector = config.pop("connector", None)
        _fill(cfg, config, "Scheduler")
        self._cost = cost
        if cost is not None:
            cfg.cost = cost._model()
        self._pool = pool
        self._host = host
        self._users = {}           # user pointer (a token) -> the request's user object
        self._ticket = itertools.count(1)
        self._exc = None           # the first exception a callback raised this step
        self._stepping = False     # True while bkv_step runs (read by the callbacks' guards)
        self._views = _Views()
        self._keep_raw = []
        self._step_lock = threading.Lock()
        ops = _ffi.bkv_host_ops()
        fn = _ffi.HOST_FN
        keep = []
        if callable(getattr(host, "launch", None)):  # overlapped scheduling
            keep.append(self._compute_cb(host.launch))
            ops.launch = keep[-1]
        if callable(getattr(host, "forward", None)):
            keep.append(self._compute_cb(host.forward))
            ops.forward = keep[-1]
        elif callable(getattr(host, "prefill", None)) and callable(getattr(host, "decode", None)):
            keep.append(self._compute_cb(host.prefill))
            ops.prefill = keep[-1]
            keep.append(self._compute_cb(host.decode))
            ops.decode = keep[-1]
        elif not callable(getattr(host, "launch", None)):
            raise TypeError("Scheduler: the host needs forward(), or prefill() and decode(), "
                            "or launch() with overlap=1")
        if callable(getattr(host, "on_token", None)):
            keep.append(fn["on_token"](self._token_cb(host.on_token)))
            ops.on_token = keep[-1]
        keep.append(fn["on_finish"](self._finish_cb(getattr(host, "on_finish", None))))
        ops.on_finish = keep[-1]
        if callable(getattr(host, "now_us", None)):
            keep.append(fn["now_us"](self._clock_cb(host.now_us)))
            ops.now_us = keep[-1]
        if callable(getattr(host, "draft", None)):
            keep.append(fn["draft"](self._draft_cb(host.draft)))
            ops.draft = keep[-1]
        self._connector = connector
        if connector is not None:
            keep.append(self._connector_struct(connector, keep))
            cfg.connector = ctypes.pointer(keep[-1])
        self._keep = keep          # the C function pointers must outlive the scheduler
        h = ctypes.c_void_p()
        check(_lib.bkv_sched_create(ctypes.byref(cfg), pool._p(), ctypes.byref(ops), None, None,
                                    ctypes.byref(h)), "bkv_sched_create")
        self._h = h
        pool._users += 1
        self._info = _ffi.bkv_step_info()
        self._info_ref = ctypes.byref(self._info)
        self._outs_c = _ffi.bkv_step_outputs()
        self._outs_c.size = ctypes.sizeof(self._outs_c)
        self._outs_ref = ctypes.byref(self._outs_c)
        self._outs = _OutsWords.from_address(ctypes.addressof(self._outs_c))  # same memory
        self._out_views = _Views()
        if outputs:
            self.enable_outputs(True)

    # -- callbacks (called by the library on the stepping thread) ----------
    def _fail(self, e):
        if self._exc is None:
            self._exc = e

    def _draft_cb(self, method):
        users = self._users

        def cb(_host, req, branch, ctx, n_ctx, out, k, user):
            try:
                context = np.ctypeslib.as_array(ctx, shape=(n_ctx,)) if n_ctx else \
                    np.zeros(0, np.int32)
                context.flags.writeable = False
                got = method(req, branch, context, k, users.get(user))
                if got is None:
                    return 0
                d = np.asarray(got, dtype=np.int32).ravel()[:k]
                for j, t in enumerate(d.tolist()):
                    out[j] = t
                return len(d)
            except BaseException as e:  # re-raised by step()
                self._fail(e)
                return 0
        return cb

    def _compute_cb(self, method):
        structs = {}                # batch address -> its ctypes struct (reused)
        views = self._views

        def cb(_host, batch, next_tokens):
            try:
                st = structs.get(batch)
                if st is None:
                    st = structs[batch] = (_ffi.bkv_batch.from_address(batch),
                                           _WORDS.from_address(batch))
                b = Batch(st[0], st[1], self)
                nt = views.get(("next_tokens", b.kind), next_tokens, b.n_rows, _I32, np.int32,
                               writable=True)
                rc = method(b, nt)
                return int(rc) if rc is not None and rc < 0 else 0
            except BaseException as e:  # re-raised by step()
                self._fail(e)
                return -1
        raw_cb = _COMPUTE_RAW(cb)
        self._keep_raw.append(raw_cb)  # the cast below does not own it
        return ctypes.cast(raw_cb, _ffi.HOST_FN["forward"])

    def _token_cb(self, method):
        users = self._users

        def cb(_host, req, branch, token, user):
            try:
                method(req, branch, token, users.get(user))
            except BaseException as e:  # re-raised by step()
                self._fail(e)
        return cb

    def _finish_cb(self, method):
        users = self._users

        def cb(_host, req, reason, user):
            obj = users.pop(user, None)
            if method is None:
                return
            try:
                method(req, FinishReason(reason), obj)
            except BaseException as e:  # re-raised by step()
                self._fail(e)
        return cb

    def _clock_cb(self, method):
        def cb(_host):
            try:
                return int(method())
            except BaseException as e:  # re-raised by step()
                self._fail(e)
                return 0
        return cb

    def _connector_struct(self, conn, keep):
        """The bkv_connector of a Python connector object; its callbacks are
        appended to keep (the library copies the struct at create, but calls
        the functions for the scheduler's life)."""
        for m in ("lookup", "load"):
            if not callable(getattr(conn, m, None)):
                raise TypeError("Scheduler: a connector needs lookup() and load() (and "
                                "optionally save(), preempted(), contains())")
        fn = _ffi.CONNECTOR_FN
        later = _ffi.BKV_CONNECTOR_LATER
        c = _ffi.bkv_connector()

        def blocks_of(p, n):
            if not n:
                return _EMPTY[XFER_BLOCK_DTYPE]
            a = np.frombuffer((_ffi.bkv_kv_xfer_block * n).from_address(
                ctypes.cast(p, ctypes.c_void_p).value), dtype=XFER_BLOCK_DTYPE).copy()
            a.flags.writeable = False
            return a

        def lookup(_u, req, hashes, n):
            try:
                h = np.ctypeslib.as_array(hashes, shape=(n,)).copy() if n else \
                    _EMPTY[np.dtype(np.uint64)]
                got = conn.lookup(req, h)
                if got is None:
                    return 0
                got = int(got)
                return later if got == later else max(-1, min(got, n))
            except BaseException as e:  # re-raised by step()
                self._fail(e)
                return -1

        def load(_u, xfer, req, blocks, n):
            try:
                rc = conn.load(xfer, req, blocks_of(blocks, n))
                return int(rc) if rc is not None and rc < 0 else 0
            except BaseException as e:  # re-raised by step()
                self._fail(e)
                return -1

        def save(_u, xfer, blocks, n):
            try:
                rc = conn.save(xfer, blocks_of(blocks, n))
                return int(rc) if rc is not None and rc < 0 else 0
            except BaseException as e:  # re-raised by step()
                self._fail(e)
                return -1

        def preempted(_u, req):
            try:
                conn.preempted(req)
            except BaseException as e:  # re-raised by step()
                self._fail(e)

        def contains(_u, h):
            try:
                return 1 if conn.contains(int(h)) else 0
            except BaseException as e:  # re-raised by step()
                self._fail(e)
                return 0

        keep.append(fn["lookup"](lookup))
        c.lookup = keep[-1]
        keep.append(fn["load"](load))
        c.load = keep[-1]
        if callable(getattr(conn, "save", None)):
            keep.append(fn["save"](save))
            c.save = keep[-1]
        if callable(getattr(conn, "preempted", None)):
            keep.append(fn["preempted"](preempted))
            c.preempted = keep[-1]
        if callable(getattr(conn, "contains", None)):
            keep.append(fn["contains"](contains))
            c.contains = keep[-1]
        c.save_blocks = int(getattr(conn, "save_blocks", 0))
        c.max_saves = int(getattr(conn, "max_saves", 0))
        return c

    # -- lifetime -------------------------------------------------------------
    def close(self):
        """Destroy the scheduler (bkv_sched_destroy): requests still open end
        with no callback. Idempotent. Not from a callback, and not while
        another thread may still call submit(), abort() or
        xfer_done() (join them first)."""
        if self._stepping:
            raise StateError("Scheduler.close: called during step()", _ffi.BKV_ESTATE)
        if getattr(self, "_h", None):
            _lib.bkv_sched_destroy(self._h)
            self._h = None
            self._pool._users -= 1
            self._users.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None) and not self._stepping:
            self.close()

    def _s(self):
        if not self._h:
            raise StateError("Scheduler: closed", _ffi.BKV_ESTATE)
        return self._h

    # -- any thread -------------------------------------------------------
    def submit(self, prompt, max_new_tokens, stop_tokens=(), priority=0, cache_key=0, n=1,
               predicted_output=0, user=None, retention=(), adapter=0, inputs=()):
        """Submit a request (bkv_submit); returns its id (never 0). It enters
        the queue at the next step. prompt and stop_tokens are token
        sequences (copied). user is handed back to on_token/on_finish and in
        Batch.users. retention: (token_start, token_end, priority,
        duration_us) tuples, bkv_retention_range (needs
        Scheduler(retention=1)). adapter: the adapter (LoRA) its rows run
        with, 0 for none (needs Scheduler(max_adapters=N)); its blocks are
        cached under adapter_cache_key(cache_key, adapter). inputs:
        encoder inputs (images, audio), (cache_id, token_start, token_len,
        cost) tuples, bkv_encoder_input (cost may be left out: 0, meaning
        token_len; needs Scheduler(encoder_cache=N)); the spans are ordered,
        inside the prompt, and hold encoder_token(cache_id, i) in every
        batch whatever the prompt held there. Any thread, concurrently with
        step().

        Raises InvalidArgumentError (empty prompt, max_new_tokens 0, n 0,
        an adapter without max_adapters, inputs without encoder_cache or
        with a bad span), TooBigError (can never fit the pool, n >
        max_running or max_seqs, an input longer than encoder_cache or
        costlier than encoder_budget),
        TryAgainError (queue full), OutOfMemoryError."""
        p = _i32(prompt)
        q = _ffi.bkv_request()
        _lib.bkv_request_init(ctypes.byref(q))
        q.prompt = p.ctypes.data_as(ctypes.POINTER(_I32))
        q.prompt_len = len(p)
        q.max_new_tokens = max_new_tokens
        if len(stop_tokens):
            st = _i32(stop_tokens)
            q.stop_tokens = st.ctypes.data_as(ctypes.POINTER(_I32))
            q.n_stop = len(st)
        q.priority = priority
        q.cache_key = cache_key
        q.n = n
        q.predicted_output = predicted_output
        q.adapter = adapter
        if len(retention):
            rr = (_ffi.bkv_retention_range * len(retention))()
            for i, (a, b, prio, dur) in enumerate(retention):
                rr[i].token_start, rr[i].token_end = a, b
                rr[i].priority, rr[i].duration_us = prio, dur
            q.retention = ctypes.cast(rr, type(q.retention))
            q.n_retention = len(retention)
        if len(inputs):
            ei = (_ffi.bkv_encoder_input * len(inputs))()
            for i, u in enumerate(inputs):
                cid, start, length = u[0], u[1], u[2]
                ei[i].cache_id, ei[i].token_start, ei[i].token_len = cid, start, length
                ei[i].cost = u[3] if len(u) > 3 else 0
            q.inputs = ctypes.cast(ei, type(q.inputs))
            q.n_inputs = len(inputs)
        ticket = next(self._ticket)
        self._users[ticket] = user  # before submit: a step may start at once
        q.user = ticket
        rid = ctypes.c_uint64()
        rc = _lib.bkv_submit(self._s(), ctypes.byref(q), ctypes.byref(rid))
        if rc < 0:
            self._users.pop(ticket, None)
            raise error(rc, "bkv_submit")
        return rid.value

    def abort(self, req_id):
        """Abort a request (bkv_abort): it ends with FinishReason.ABORT at the
        next step. Any thread, and from callbacks. NotFoundError when unknown,
        already ended or already aborted."""
        check(_lib.bkv_abort(self._s(), int(req_id)), "bkv_abort")

    def xfer_done(self, xfer, status=0, failed=()):
        """Complete a connector transfer (bkv_kv_xfer_done): xfer is the id
        the connector's load or save was given; every block it named is done
        except the indices (into that call's blocks) in failed; a negative
        status fails the whole transfer. Takes effect at the next step. Any
        thread, and from the connector's own load/save (the transfer may
        complete inside the call that started it). NotFoundError when no
        transfer in flight has that id (unknown or already completed),
        InvalidArgumentError for an index past the transfer's blocks; nothing
        changes on an error."""
        f = np.ascontiguousarray(failed, dtype=np.uint32).ravel()
        p = f.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)) if len(f) else None
        check(_lib.bkv_kv_xfer_done(self._s(), int(xfer), int(status), p, len(f)),
              "bkv_kv_xfer_done")

    @property
    def pending(self):
        """Requests not yet ended (bkv_sched_pending; a snapshot, any thread)."""
        return _lib.bkv_sched_pending(self._s())

    # -- the stepping thread ------------------------------------------------
    def step(self):
        """Run one iteration (bkv_step) and return its StepInfo.

        Re-raises an exception a callback raised (see the module's doc: from
        a compute callback the step was rolled back; retry). HostError when a
        compute callback returned a negative int. StateError from a callback
        or while another thread steps."""
        h = self._s()
        if not self._step_lock.acquire(False):
            raise StateError("Scheduler.step: already stepping (a callback or another thread)",
                             _ffi.BKV_ESTATE)
        self._stepping = True
        self._pool._stepping = True
        try:
            rc = _lib.bkv_step(h, self._info_ref)
        finally:
            self._stepping = False
            self._pool._stepping = False
            self._step_lock.release()
        exc = self._exc
        if exc is not None:
            self._exc = None
            if rc == _ffi.BKV_EHOST and hasattr(exc, "add_note"):
                exc.add_note("batchkv: the host call failed and bkv_step rolled the step back "
                             "(BKV_EHOST); step() again to retry")
            raise exc
        if rc < 0:
            raise error(rc, "bkv_step")
        return _from_struct(StepInfo, self._info)

    def release_kv(self, mode=_ffi.BKV_RELEASE_REFUSE):
        """Give the device KV memory back (bkv_sched_kv_release): mode
        BKV_RELEASE_REFUSE (StateError while requests run), _RECOMPUTE or
        _SWAP (then make the pool's pending swap-out copies and clear them
        before freeing the memory). Until resume_kv() a step only drains.
        A connector's save called by the release (the lanes it closes) is
        re-raised here when it raised."""
        rc = _lib.bkv_sched_kv_release(self._between(), int(mode))
        exc, self._exc = self._exc, None
        if exc is not None:
            raise exc
        check(rc, "bkv_sched_kv_release")

    def resume_kv(self):
        """Take the device KV memory again (bkv_sched_kv_resume)."""
        check(_lib.bkv_sched_kv_resume(self._between()), "bkv_sched_kv_resume")

    def wait(self, timeout=None):
        """Block until a request is pending, wake() is called from another
        thread, or timeout seconds pass (None: no limit; 0: a poll)
        (bkv_sched_wait; the GIL is released meanwhile). True when a request
        is pending. The stepping thread, between steps."""
        us = 2 ** 64 - 1 if timeout is None else max(0, int(timeout * 1e6))
        rc = _lib.bkv_sched_wait(self._between(), us)
        if rc == _ffi.BKV_EAGAIN:
            return False
        check(rc, "bkv_sched_wait")
        return True

    def wake(self):
        """End a wait() now (bkv_sched_wake; any thread)."""
        check(_lib.bkv_sched_wake(self._s()), "bkv_sched_wake")

    def enable_outputs(self, on=True):
        """Record each step's outputs as arrays (bkv_sched_outputs_enable;
        Scheduler(outputs=True) does it at creation): read them with
        outputs() after each step, with or without host.on_token."""
        check(_lib.bkv_sched_outputs_enable(self._between(), 1 if on else 0),
              "bkv_sched_outputs_enable")

    def outputs(self):
        """What the last step delivered (bkv_sched_outputs_get), a
        StepOutputs of read-only numpy views valid until the next step: the
        tokens in on_token's order and the ended requests in on_finish's.
        StateError when outputs are off (enable_outputs)."""
        check(_lib.bkv_sched_outputs_get(self._between(), self._outs_ref), "bkv_sched_outputs_get")
        o, v = self._outs, self._out_views
        nt, nf = o.n_tokens, o.n_finished
        return StepOutputs(v.get("req", o.token_req, nt, ctypes.c_uint64, np.uint64),
                           v.get("branch", o.token_branch, nt, ctypes.c_uint32, np.uint32),
                           v.get("tok", o.token_ids, nt, ctypes.c_int32, np.int32),
                           v.get("freq", o.finished_req, nf, ctypes.c_uint64, np.uint64),
                           v.get("fwhy", o.finished_reason, nf, ctypes.c_int32, np.int32))

    def _two_phase(self, call):
        h = self._s()
        if not self._step_lock.acquire(False):
            raise StateError("Scheduler: already stepping (a callback or another thread)",
                             _ffi.BKV_ESTATE)
        self._stepping = True
        self._pool._stepping = True
        try:
            rc = call(h)
        finally:
            self._stepping = False
            self._pool._stepping = False
            self._step_lock.release()
        exc = self._exc
        if exc is not None:
            self._exc = None
            raise exc
        return rc

    def launch(self):
        """Overlapped scheduling (Scheduler(overlap=N), a host with
        launch(batch, next_tokens)): plan the next step while up to N steps
        run, and hand it to host.launch, which enqueues it and returns at
        once; the host writes next_tokens (a view that stays valid until
        complete) before completing. Placeholders in the batch's token_ids
        name rows of steps still outstanding (batchkv.overlap:
        token_pending_at, resolve_placeholders). Returns the step's ticket
        (0: nothing to compute: complete the oldest outstanding step, launch
        again), or
        None when the plan needs the results of the steps in flight first
        (bkv_step_launch answered BKV_EAGAIN: complete every outstanding
        step). With N + 1 steps outstanding complete the oldest before
        launching (else StateError). The batch's views are valid during
        host.launch only (copy what the device reads later). HostError when
        host.launch failed."""
        t = ctypes.c_uint64()
        rc = self._two_phase(lambda h: _lib.bkv_step_launch(h, ctypes.byref(t), self._info_ref))
        if rc == _ffi.BKV_EAGAIN:
            return None
        if rc < 0:
            raise error(rc, "bkv_step_launch")
        return t.value

    def complete(self, ticket, ok=True):
        """Complete the oldest outstanding step (bkv_step_complete): ok=True
        when the device ran it and its next_tokens are written; False when it
        failed (every outstanding step then fails: complete each; the last
        completion rolls them back). Returns its StepInfo; HostError when
        this or an earlier outstanding step failed (rolled back: launch
        again)."""
        rc = self._two_phase(lambda h: _lib.bkv_step_complete(h, int(ticket), 0 if ok else -1,
                                                              self._info_ref))
        if rc < 0:
            raise error(rc, "bkv_step_complete")
        return _from_struct(StepInfo, self._info)

    def run(self, max_steps=None):
        """step() until nothing is pending (or max_steps steps); returns the
        number of steps taken."""
        steps = 0
        while self.pending and (max_steps is None or steps < max_steps):
            self.step()
            steps += 1
        return steps

    def stats(self):
        """SchedStats, the cumulative counters (bkv_sched_stats_get)."""
        st = _ffi.bkv_sched_stats()
        st.size = ctypes.sizeof(st)
        _lib.bkv_sched_stats_get(self._between(), ctypes.byref(st))
        return _from_struct(SchedStats, st)

    def check(self):
        """Verify the scheduler's and its pool's invariants (bkv_sched_check):
        0 when consistent, else the invariant's number."""
        return _lib.bkv_sched_check(self._between())

    def metrics(self):
        """The Prometheus text exposition of the scheduler's and pool's
        metrics (bkv_sched_metrics_prometheus), as a str."""
        h = self._between()
        n = _lib.bkv_sched_metrics_prometheus(h, None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        _lib.bkv_sched_metrics_prometheus(h, buf, n + 1)
        return buf.value.decode()

    def _between(self):
        if self._stepping:
            raise StateError("Scheduler: called during step()", _ffi.BKV_ESTATE)
        return self._s()

    @property
    def pool(self):
        return self._pool

