"""batchkv.pool - the block-paged KV pool (bkv_pool) and its sequences.

A Pool owns block *indices* only: device_blocks frames of block_tokens slots,
an optional host tier for swap, one block table per sequence, copy-on-write
sharing and a prefix cache. The host keeps the KV tensors and performs the
block copies the pool lists (copies()).

Thread rules (the header's): a pool belongs to one thread at a time, and
while a Scheduler uses it, only between that scheduler's steps; a call made
during a step (from a callback) raises StateError instead of corrupting it.
"""
import collections
import ctypes
import enum
import operator
import struct as _struct

import numpy as np

from . import _ffi
from ._native import _lib
from .errors import StateError, check

__all__ = ["Pool", "CopyKind", "EventKind", "SeqInfo", "PoolStats", "PoolMemory", "BlockState",
           "BlockInfo", "KvEvent", "SeqImage", "ModelShape", "kv_bytes_per_token", "blocks_for_bytes", "block_hashes",
           "GroupKind", "KvGroup", "kv_group_page_bytes", "kv_frame_bytes", "kv_state_frames",
           "kv_group_blocks_held", "kv_seq_bytes", "frames_for_bytes"]


class CopyKind(enum.IntEnum):
    """bkv_copy_kind: which list a block copy is in."""
    DEVICE = _ffi.BKV_COPY_DEVICE      # device -> device (copy-on-write)
    SWAP_OUT = _ffi.BKV_COPY_SWAP_OUT  # device -> host
    SWAP_IN = _ffi.BKV_COPY_SWAP_IN    # host -> device


class BlockState(enum.IntEnum):
    """bkv_block_state: what a device block holds."""
    FREE = _ffi.BKV_BLOCK_FREE      # on the free list, no content
    PINNED = _ffi.BKV_BLOCK_PINNED  # referenced, or a pending copy's source
    CACHED = _ffi.BKV_BLOCK_CACHED  # unreferenced, kept in the prefix cache


class GroupKind(enum.IntEnum):
    """bkv_group_kind: what a KV group's layers keep."""
    FULL = _ffi.BKV_GROUP_FULL        # full attention: every token's KV
    WINDOW = _ffi.BKV_GROUP_WINDOW    # sliding window of span tokens
    CHUNKED = _ffi.BKV_GROUP_CHUNKED  # chunked local attention, chunks of span
    STATE = _ffi.BKV_GROUP_STATE      # recurrent state: bytes per sequence per layer


class EventKind(enum.IntEnum):
    """bkv_kv_event_kind."""
    STORED = _ffi.BKV_EVENT_STORED
    REMOVED = _ffi.BKV_EVENT_REMOVED
    CLEARED = _ffi.BKV_EVENT_CLEARED


def _record(name, struct, doc, skip=("size", "reserved")):
    fields = [f for f, _ in struct._fields_ if f not in skip]
    cls = collections.namedtuple(name, fields)
    cls.__doc__ = doc
    return cls


SeqInfo = _record("SeqInfo", _ffi.bkv_seq_info, "bkv_seq_info: len, n_blocks, swapped, key.")
PoolStats = _record("PoolStats", _ffi.bkv_pool_stats,
                    "bkv_pool_stats: the pool's live counters (free + used + cached = "
                    "device_blocks). Field meanings as in batchkv.h.")
PoolMemory = _record("PoolMemory", _ffi.bkv_pool_memory,
                     "bkv_pool_memory: the bytes a pool holds, by structure (total: all of "
                     "them, the handle included). Field meanings as in batchkv.h.")
BlockInfo = collections.namedtuple(
    "BlockInfo", "state ref_count fill indexed copy_pending kids parent key hash tokens")
BlockInfo.__doc__ = ("bkv_block_info: one device block (state a BlockState; tokens a new "
                     "int32 numpy array of its fill tokens). Field meanings as in batchkv.h.")
KvEvent = _record("KvEvent", _ffi.bkv_kv_event,
                  "bkv_kv_event: seq, hash, parent_hash, key, kind (EventKind), token_count, "
                  "block, has_parent, medium (0 device, 1 host cache, 2 a KV connector's store).")
ModelShape = collections.namedtuple("ModelShape", "layers kv_heads head_dim dtype_bytes")
ModelShape.__doc__ = "bkv_model_shape: the shape of a model's KV cache."


KvGroup = collections.namedtuple("KvGroup", "kind layers span bytes", defaults=(0, 0))
KvGroup.__doc__ = ("bkv_kv_group: one group of a hybrid model's layers. kind a GroupKind; "
                   "span the window or chunk in tokens (STATE: tokens between checkpoints); "
                   "bytes KV bytes per token per layer (STATE: per sequence per layer).")


def _groups(groups):
    """A ctypes bkv_kv_group array of KvGroups or (kind, layers, span, bytes)
    tuples (at least one element, so a pointer to it always exists)."""
    groups = [KvGroup(*g) for g in groups]
    arr = (_ffi.bkv_kv_group * max(len(groups), 1))()
    for i, g in enumerate(groups):
        arr[i].kind, arr[i].layers, arr[i].span, arr[i].bytes = (
            int(g.kind), int(g.layers), int(g.span), int(g.bytes))
    return arr, len(groups)


def _fill(struct, fields, what):
    for k, v in fields.items():
        if k in ("size", "reserved") or not hasattr(type(struct), k):
            raise TypeError("%s: unknown field %r" % (what, k))
        setattr(struct, k, int(v) if isinstance(v, (bool, enum.IntEnum)) else v)


_CODES = {ctypes.c_uint32: "I", ctypes.c_int32: "i", ctypes.c_uint64: "Q", ctypes.c_int64: "q",
          ctypes.c_double: "d", ctypes.c_int: "i", ctypes.c_uint8: "B"}


def _unpacker(cls, ctype):
    """A struct.Struct reading the record's fields straight out of the C
    struct's bytes (one call instead of a ctypes attribute read per field),
    or None when a field is not a plain scalar."""
    fmt, at = "=", 0
    for name in cls._fields:
        d = getattr(ctype, name)
        code = _CODES.get(dict(ctype._fields_)[name])
        if code is None or d.offset < at:
            return None
        fmt += "x" * (d.offset - at) + code
        at = d.offset + d.size
    return _struct.Struct(fmt)


def _from_struct(cls, s):
    """A record (namedtuple) of a ctypes struct's fields named in cls."""
    get = cls.__dict__.get("_get")
    if get is None:
        u = _unpacker(cls, type(s))
        if u:
            get = (lambda x, f=u.unpack_from: f(x))
        else:  # array fields (a tuple each, not a view of the struct)
            a = operator.attrgetter(*cls._fields)
            get = (lambda x: tuple(tuple(v) if isinstance(v, ctypes.Array) else v for v in a(x)))
        cls._get = get
    return tuple.__new__(cls, get(s))


def _i32(tokens):
    """A C-contiguous int32 copy or view of a token sequence."""
    return np.ascontiguousarray(tokens, dtype=np.int32)


def _ptr(arr, ctype):
    return arr.ctypes.data_as(ctypes.POINTER(ctype))


def _shape(shape):
    s = _ffi.bkv_model_shape()
    s.layers, s.kv_heads, s.head_dim, s.dtype_bytes = (int(x) for x in shape)
    return s


def kv_bytes_per_token(shape):
    """Bytes of KV one token occupies (bkv_kv_bytes_per_token); shape is a
    ModelShape or a (layers, kv_heads, head_dim, dtype_bytes) tuple. 0 on bad
    input."""
    s = _shape(shape)
    return _lib.bkv_kv_bytes_per_token(ctypes.byref(s))


def blocks_for_bytes(budget, shape, block_tokens):
    """Whole blocks of block_tokens tokens that fit in budget bytes
    (bkv_blocks_for_bytes); 0 on bad input."""
    s = _shape(shape)
    return _lib.bkv_blocks_for_bytes(int(budget), ctypes.byref(s), int(block_tokens))


def kv_group_page_bytes(group, block_tokens):
    """Bytes of one page of a group (bkv_kv_group_page_bytes): one block of an
    attention group, one unit of a STATE group; 0 on bad input."""
    arr, _ = _groups([group])
    return _lib.bkv_kv_group_page_bytes(arr, int(block_tokens))


def kv_frame_bytes(groups, block_tokens):
    """Bytes of one frame of a pool with these groups (bkv_kv_frame_bytes);
    0 on bad input."""
    arr, n = _groups(groups)
    return _lib.bkv_kv_frame_bytes(arr, n, int(block_tokens))


def kv_state_frames(groups, block_tokens):
    """Frames one state unit takes (bkv_kv_state_frames); 0 without a STATE
    group or on bad input."""
    arr, n = _groups(groups)
    return _lib.bkv_kv_state_frames(arr, n, int(block_tokens))


def kv_group_blocks_held(group, block_tokens, tokens):
    """Blocks a sequence of tokens tokens holds in the group while the next
    token is computed (bkv_kv_group_blocks_held); 0 for STATE or bad input."""
    arr, _ = _groups([group])
    return _lib.bkv_kv_group_blocks_held(arr, int(block_tokens), int(tokens))


def kv_seq_bytes(groups, tokens, block_tokens=0):
    """Bytes a sequence of tokens tokens holds (bkv_kv_seq_bytes): token-exact
    with block_tokens 0, else what a pool of that block size holds. 0 on bad
    input."""
    arr, n = _groups(groups)
    return _lib.bkv_kv_seq_bytes(arr, n, int(block_tokens), int(tokens))


def frames_for_bytes(budget, groups, block_tokens):
    """Frames of a pool with these groups that fit in budget bytes
    (bkv_frames_for_bytes); 0 on bad input."""
    arr, n = _groups(groups)
    return _lib.bkv_frames_for_bytes(int(budget), arr, n, int(block_tokens))


def block_hashes(tokens, block_tokens, hash_seed=0, key=0):
    """Chained hashes of the full blocks of tokens (bkv_block_hashes), the
    hashes a pool with this seed and block size gives them in its KV events.
    Returns a uint64 numpy array of len(tokens) // block_tokens entries."""
    t = _i32(tokens)
    out = np.zeros(len(t) // max(int(block_tokens), 1), dtype=np.uint64)
    n = _lib.bkv_block_hashes(int(hash_seed), int(key), int(block_tokens),
                              _ptr(t, ctypes.c_int32), len(t), _ptr(out, ctypes.c_uint64))
    return out[:n]


class SeqImage:
    """An exported sequence (bkv_seq_image) as plain data: block_tokens, len,
    key, hash_seed and numpy arrays blocks (int32), hashes (uint64) and
    tokens (int32). A pool with KV groups adds n_groups, group_blocks (an
    (n_lanes, n_blocks) int32 array: each attention group after the first's
    blocks, -1 where it released one), state_frame and state_frames (its
    STATE group's live unit) and group_layout (the groups' checksum).
    Picklable; Pool.import_image reads it back."""

    def __init__(self, block_tokens, length, key, hash_seed, blocks, hashes, tokens,
                 n_groups=0, group_blocks=None, state_frame=-1, state_frames=0,
                 group_layout=0):
        self.block_tokens = int(block_tokens)
        self.len = int(length)
        self.key = int(key)
        self.hash_seed = int(hash_seed)
        self.blocks = np.ascontiguousarray(blocks, dtype=np.int32)
        self.hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
        self.tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        self.n_groups = int(n_groups)
        self.group_blocks = (np.zeros((0, len(self.blocks)), np.int32) if group_blocks is None
                             else np.ascontiguousarray(group_blocks, dtype=np.int32))
        self.state_frame = int(state_frame)
        self.state_frames = int(state_frames)
        self.group_layout = int(group_layout)

    @property
    def n_blocks(self):
        return len(self.blocks)

    def __repr__(self):
        return "SeqImage(len=%d, n_blocks=%d, key=%d)" % (self.len, self.n_blocks, self.key)


def _image_lanes(n_groups, state_frames):
    """Attention groups after the first in an image's group list."""
    return max(int(n_groups) - 1 - (1 if state_frames else 0), 0)


class Pool:
    """A block-paged KV pool (bkv_pool_create).

    Keyword arguments are bkv_pool_config fields; unset ones keep
    bkv_pool_config_init's defaults (block_tokens 16, host_blocks 0,
    max_seqs 1024, watermark_blocks 0, prefix_cache True, hash_seed 0,
    event_capacity 0). device_blocks is required. groups, a sequence of
    KvGroup, configures a hybrid model's KV groups (n_groups follows; the
    pool copies them).

        pool = Pool(device_blocks=4096, block_tokens=16, host_blocks=1024)

    Raises InvalidArgumentError for a field out of range, OutOfMemoryError.
    Use as a context manager or call close(); a Pool a live Scheduler or
    VllmEncoder uses cannot be closed (StateError).
    """

    def __init__(self, **config):
        cfg = _ffi.bkv_pool_config()
        _lib.bkv_pool_config_init(ctypes.byref(cfg))
        groups = config.pop("groups", None)
        if groups is not None:
            keep, cfg.n_groups = _groups(groups)
            cfg.groups = keep
        _fill(cfg, config, "Pool")
        h = ctypes.c_void_p()
        check(_lib.bkv_pool_create(ctypes.byref(cfg), None, ctypes.byref(h)), "bkv_pool_create")
        self._h = h
        self._stepping = False  # set by the Scheduler around bkv_step
        self._users = 0         # live schedulers and vLLM encoders over this pool
        self.block_tokens = cfg.block_tokens
        self.device_blocks = cfg.device_blocks
        self.host_blocks = cfg.host_blocks
        self.hash_seed = cfg.hash_seed

    # -- lifetime ---------------------------------------------------------
    def close(self):
        """Destroy the pool (bkv_pool_destroy). Idempotent."""
        if self._users:
            raise StateError("Pool.close: a Scheduler or VllmEncoder still uses this pool",
                             _ffi.BKV_ESTATE)
        if self._h:
            _lib.bkv_pool_destroy(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None) and not self._users:
            _lib.bkv_pool_destroy(self._h)
            self._h = None

    def _p(self):
        if self._stepping:
            raise StateError("Pool: called during a bkv_step of its scheduler", _ffi.BKV_ESTATE)
        if not self._h:
            raise StateError("Pool: closed", _ffi.BKV_ESTATE)
        return self._h

    # -- sequences --------------------------------------------------------
    def open(self, key=0):
        """Open an empty sequence (bkv_seq_open / bkv_seq_open_keyed with a
        nonzero prefix-cache key). Returns its id. TryAgainError at max_seqs."""
        seq = ctypes.c_uint32()
        if key:
            check(_lib.bkv_seq_open_keyed(self._p(), int(key), ctypes.byref(seq)),
                  "bkv_seq_open_keyed")
        else:
            check(_lib.bkv_seq_open(self._p(), ctypes.byref(seq)), "bkv_seq_open")
        return seq.value

    def append(self, seq, tokens):
        """Append tokens (bkv_seq_append); returns how many leading tokens
        were prefix-cache hits. All-or-nothing: NoSpaceError, TooBigError,
        StateError (swapped), NotFoundError leave the sequence unchanged."""
        t = _i32(tokens)
        hit = ctypes.c_uint32()
        check(_lib.bkv_seq_append(self._p(), seq, _ptr(t, ctypes.c_int32), len(t),
                                  ctypes.byref(hit)), "bkv_seq_append")
        return hit.value

    def blocks_needed(self, seq, n):
        """Blocks an append of n tokens would take (bkv_seq_blocks_needed)."""
        return check(_lib.bkv_seq_blocks_needed(self._p(), seq, int(n)), "bkv_seq_blocks_needed")

    def truncate(self, seq, new_len):
        """Shorten a sequence to new_len tokens (bkv_seq_truncate)."""
        check(_lib.bkv_seq_truncate(self._p(), seq, int(new_len)), "bkv_seq_truncate")

    def fork(self, parent):
        """A new sequence sharing every block of parent (bkv_seq_fork)."""
        child = ctypes.c_uint32()
        check(_lib.bkv_seq_fork(self._p(), parent, ctypes.byref(child)), "bkv_seq_fork")
        return child.value

    def close_seq(self, seq):
        """Close a finished sequence; its full cached blocks stay cached
        (bkv_seq_close)."""
        check(_lib.bkv_seq_close(self._p(), seq), "bkv_seq_close")

    def drop(self, seq):
        """Drop an aborted sequence; its blocks leave the cache (bkv_seq_drop)."""
        check(_lib.bkv_seq_drop(self._p(), seq), "bkv_seq_drop")

    def blocks(self, seq):
        """The sequence's block table (bkv_seq_blocks) as a new int32 numpy
        array (a copy: the library's table moves when the sequence changes).
        NotFoundError for an unknown sequence."""
        n = ctypes.c_uint32()
        p = _lib.bkv_seq_blocks(self._p(), seq, ctypes.byref(n))
        if not p:
            check(_ffi.BKV_ENOENT, "bkv_seq_blocks")
        return np.ctypeslib.as_array(p, shape=(n.value,)).copy() if n.value else \
            np.zeros(0, np.int32)

    def group_blocks(self, seq, group):
        """The sequence's block table in one KV group (bkv_seq_group_blocks)
        as a new int32 numpy array (a copy, as blocks()): as long as group
        0's, with -1 for the blocks a sliding-window or chunked group
        released. Group 0 is blocks(seq); a pool without groups has only
        group 0. NotFoundError for an unknown sequence or group."""
        n = ctypes.c_uint32()
        p = _lib.bkv_seq_group_blocks(self._p(), seq, int(group), ctypes.byref(n))
        if not p:
            check(_ffi.BKV_ENOENT, "bkv_seq_group_blocks")
        return np.ctypeslib.as_array(p, shape=(n.value,)).copy() if n.value else \
            np.zeros(0, np.int32)

    def state_frames(self, seq):
        """The sequence's recurrent-state units (bkv_seq_state_frames), for a
        pool whose last group is STATE: (in, out), each a unit's first frame
        (a unit is kv_state_frames(groups, block_tokens) consecutive frames).
        After an append, in is the state before the appended tokens (-1: the
        zero state) and out is where the state after them goes (-1: nothing
        appended since the state was committed); the next append makes out
        the sequence's state. InvalidArgumentError without a STATE group,
        NotFoundError for an unknown sequence."""
        i, o = ctypes.c_int32(), ctypes.c_int32()
        check(_lib.bkv_seq_state_frames(self._p(), seq, ctypes.byref(i), ctypes.byref(o)),
              "bkv_seq_state_frames")
        return i.value, o.value

    def info(self, seq):
        """SeqInfo(len, n_blocks, swapped, key) of a sequence (bkv_seq_info_get)."""
        i = _ffi.bkv_seq_info()
        check(_lib.bkv_seq_info_get(self._p(), seq, ctypes.byref(i)), "bkv_seq_info_get")
        return SeqInfo(i.len, i.n_blocks, bool(i.swapped), i.key)

    def swap_out(self, seq):
        """Move a sequence to the host tier (bkv_seq_swap_out)."""
        check(_lib.bkv_seq_swap_out(self._p(), seq), "bkv_seq_swap_out")

    def swap_in(self, seq):
        """Bring a swapped sequence back (bkv_seq_swap_in)."""
        check(_lib.bkv_seq_swap_in(self._p(), seq), "bkv_seq_swap_in")

    # -- copies, cache, counters -------------------------------------------
    def copies(self, kind):
        """Pending copies of one CopyKind (bkv_pool_pending_copies) as a new (n, 2)
        int32 array of (src, dst) rows, in the order to perform them."""
        out = ctypes.POINTER(_ffi.bkv_copy)()
        n = _lib.bkv_pool_pending_copies(self._p(), int(kind), ctypes.byref(out))
        if n == 0:
            return np.zeros((0, 2), np.int32)
        return _copies_view(out, n).copy()

    def clear_copies(self, kind):
        """Forget pending copies of one kind once performed (bkv_pool_clear_copies)."""
        _lib.bkv_pool_clear_copies(self._p(), int(kind))

    def available(self):
        """Free plus reclaimable device blocks (bkv_pool_available)."""
        return _lib.bkv_pool_available(self._p())

    def can_admit(self, n_tokens):
        """Would a new sequence of n_tokens fit above the watermark
        (bkv_pool_can_admit)?"""
        return bool(_lib.bkv_pool_can_admit(self._p(), int(n_tokens)))

    def pin_prefix(self, tokens, key=0):
        """Pin the cached leading full blocks of tokens under key until
        unpin (bkv_pool_pin_prefix); returns (pin, pinned_tokens). NotFoundError
        (nothing cached), NoSpaceError (past the pool's pin_permille share)."""
        t = _i32(tokens)
        pin = ctypes.c_uint32()
        got = ctypes.c_uint32()
        check(_lib.bkv_pool_pin_prefix(self._p(), int(key), _ptr(t, ctypes.c_int32), len(t),
                                       ctypes.byref(pin), ctypes.byref(got)),
              "bkv_pool_pin_prefix")
        return pin.value, got.value

    def unpin(self, pin):
        """End a pin (bkv_pool_unpin): its blocks go back to the cache."""
        check(_lib.bkv_pool_unpin(self._p(), int(pin)), "bkv_pool_unpin")

    def reset_cache(self):
        """Empty the prefix cache (bkv_pool_reset_cache)."""
        check(_lib.bkv_pool_reset_cache(self._p()), "bkv_pool_reset_cache")

    def stats(self):
        """PoolStats, the live counters (bkv_pool_stats_get)."""
        s = _ffi.bkv_pool_stats()
        s.size = ctypes.sizeof(s)
        _lib.bkv_pool_stats_get(self._p(), ctypes.byref(s))
        return _from_struct(PoolStats, s)

    def memory(self):
        """PoolMemory, the bytes the pool holds by structure (bkv_pool_memory_get)."""
        m = _ffi.bkv_pool_memory()
        m.size = ctypes.sizeof(m)
        check(_lib.bkv_pool_memory_get(self._p(), ctypes.byref(m)), "bkv_pool_memory_get")
        return _from_struct(PoolMemory, m)

    def block(self, block):
        """BlockInfo of one device block (bkv_block_info_get); its tokens are
        copied. InvalidArgumentError for a block id out of range."""
        i = _ffi.bkv_block_info()
        i.size = ctypes.sizeof(i)
        check(_lib.bkv_block_info_get(self._p(), int(block), ctypes.byref(i)),
              "bkv_block_info_get")
        toks = np.ctypeslib.as_array(i.tokens, shape=(i.fill,)).copy() if i.tokens else \
            np.zeros(0, np.int32)
        return BlockInfo(BlockState(i.state), i.ref_count, i.fill, bool(i.indexed),
                         bool(i.copy_pending), i.kids, i.parent, i.key, i.hash, toks)

    def check(self):
        """Walk every invariant (bkv_pool_check): 0 when consistent, else the
        number of the violated invariant."""
        return _lib.bkv_pool_check(self._p())

    def events(self, max_events=1024):
        """Drain up to max_events KV events (bkv_pool_drain_events), oldest first,
        as a list of KvEvent. Empty when event_capacity is 0."""
        buf = (_ffi.bkv_kv_event * max_events)()
        n = _lib.bkv_pool_drain_events(self._p(), buf, max_events)
        return [KvEvent(e.seq, e.hash, e.parent_hash, e.key, EventKind(e.kind), e.token_count,
                        e.block, e.has_parent, e.medium) for e in buf[:n]]

    # -- export / import -----------------------------------------------------
    def export(self, seq):
        """Export a device-resident sequence (bkv_seq_export) as a SeqImage.
        The sequence is unchanged; keep it open until its KV was copied."""
        img = _ffi.bkv_seq_image()
        img.size = ctypes.sizeof(img)
        rc = _lib.bkv_seq_export(self._p(), seq, ctypes.byref(img))
        if rc != _ffi.BKV_E2BIG:  # the first call asks for the sizes
            check(rc, "bkv_seq_export")
        blocks = np.zeros(img.n_blocks, np.int32)
        hashes = np.zeros(img.n_blocks, np.uint64)
        tokens = np.zeros(img.len, np.int32)
        img.blocks, img.hashes, img.tokens = (_ptr(blocks, ctypes.c_int32),
                                              _ptr(hashes, ctypes.c_uint64),
                                              _ptr(tokens, ctypes.c_int32))
        img.cap_blocks, img.cap_tokens = len(blocks), len(tokens)
        lanes = np.full((_image_lanes(img.n_groups, img.state_frames), img.n_blocks), -1, np.int32)
        if lanes.size:
            img.group_blocks = _ptr(lanes, ctypes.c_int32)
        check(_lib.bkv_seq_export(self._p(), seq, ctypes.byref(img)), "bkv_seq_export")
        return SeqImage(img.block_tokens, img.len, img.key, img.hash_seed, blocks, hashes, tokens,
                        img.n_groups, lanes, img.state_frame, img.state_frames, img.group_layout)

    def import_image(self, image):
        """Import a SeqImage as a new sequence (bkv_seq_import). Returns
        (seq, transfers): transfers is an (n, 2) int32 array of (source
        pool's block, this pool's block) KV copies the host must make before
        its next computation. The image is validated whole (InvalidArgumentError)."""
        img = _ffi.bkv_seq_image()
        img.size = ctypes.sizeof(img)
        img.block_tokens, img.len, img.n_blocks = image.block_tokens, image.len, image.n_blocks
        img.key, img.hash_seed = image.key, image.hash_seed
        blocks, hashes, tokens = (np.ascontiguousarray(image.blocks, np.int32),
                                  np.ascontiguousarray(image.hashes, np.uint64),
                                  np.ascontiguousarray(image.tokens, np.int32))
        img.blocks, img.hashes, img.tokens = (_ptr(blocks, ctypes.c_int32),
                                              _ptr(hashes, ctypes.c_uint64),
                                              _ptr(tokens, ctypes.c_int32))
        img.cap_blocks, img.cap_tokens = min(len(blocks), len(hashes)), len(tokens)
        n_groups = getattr(image, "n_groups", 0)
        state_frames = getattr(image, "state_frames", 0)
        lanes = np.ascontiguousarray(getattr(image, "group_blocks", np.zeros((0, 0))), np.int32)
        img.n_groups, img.state_frames = n_groups, state_frames
        img.state_frame = getattr(image, "state_frame", -1)
        img.group_layout = getattr(image, "group_layout", 0)
        n_lanes = _image_lanes(n_groups, state_frames)
        if n_lanes:
            if lanes.ndim != 2 or lanes.shape[0] != n_lanes:
                raise ValueError("group_blocks must have one row per attention group after the first")
            img.cap_blocks = min(img.cap_blocks, lanes.shape[1])
            img.group_blocks = _ptr(lanes, ctypes.c_int32)
        transfers = (_ffi.bkv_copy * max(image.n_blocks * (1 + n_lanes) + state_frames, 1))()
        seq, n = ctypes.c_uint32(), ctypes.c_uint32()
        check(_lib.bkv_seq_import(self._p(), ctypes.byref(img), ctypes.byref(seq), transfers,
                                  ctypes.byref(n)), "bkv_seq_import")
        out = np.frombuffer(transfers, dtype=np.int32).reshape(-1, 2)[:n.value].copy()
        return seq.value, out


def _copies_view(ptr, n):
    """A zero-copy (n, 2) int32 view of a bkv_copy array."""
    addr = ctypes.cast(ptr, ctypes.c_void_p).value
    return np.frombuffer((ctypes.c_int32 * (2 * n)).from_address(addr),
                         dtype=np.int32).reshape(n, 2)
