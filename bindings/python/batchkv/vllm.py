"""batchkv.vllm - a pool's KV events in vLLM's wire format (bkv_vllm_encoder).

Routers built for vLLM (llm-d's KV-cache manager, NVIDIA Dynamo's KV router,
the SGLang router) follow a replica through msgpack KVEventBatch messages
sent over ZeroMQ. A VllmEncoder drains a Pool's KV events and writes exactly
the bytes a vLLM replica writes for the same blocks, with vLLM's block hashes
when asked (docs/scaling.md, "Looking like a vLLM replica"):

    pool = batchkv.Pool(device_blocks=1024, event_capacity=4096)
    with batchkv.VllmEncoder(pool, wire=batchkv.VllmWire.ARRAY,
                             data_parallel_rank=0) as enc:
        ...                         # pool calls, scheduler steps
        payload = enc.encode(pool)  # b"" when there was nothing to send
        if payload:
            pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])

Thread rules (the header's): the encoder belongs to the pool's thread; call
encode() between pool calls (never from inside a scheduler step: StateError).
The encoder keeps its pool alive, and the pool cannot be closed while an
encoder uses it (StateError).
"""
import ctypes
import enum
import time

from . import _ffi
from ._native import _lib
from .errors import InvalidArgumentError, StateError, check

__all__ = ["VllmEncoder", "VllmWire", "VllmHash", "vllm_block_hashes", "vllm_hash_int",
           "DIGEST_BYTES"]

DIGEST_BYTES = _ffi.BKV_VLLM_DIGEST_BYTES


class VllmWire(enum.IntEnum):
    """bkv_vllm_wire: how KVEventBatch and its events are laid out."""
    MAP = _ffi.BKV_VLLM_WIRE_MAP            # current vLLM: structs as maps, "type" tags
    ARRAY = _ffi.BKV_VLLM_WIRE_ARRAY        # array_like (what llm-d and Dynamo decode)
    ARRAY_V0 = _ffi.BKV_VLLM_WIRE_ARRAY_V0  # the first array_like vLLM


class VllmHash(enum.IntEnum):
    """bkv_vllm_hash: which block hash the events carry."""
    NATIVE = _ffi.BKV_VLLM_HASH_NATIVE            # the pool's own 64-bit hash
    SHA256_CBOR = _ffi.BKV_VLLM_HASH_SHA256_CBOR  # vLLM's "sha256_cbor"
    SHA256 = _ffi.BKV_VLLM_HASH_SHA256            # vLLM's "sha256" (pickle)


_STRINGS = ("hash_seed", "medium", "spec_kind", "host_medium")
_INTS = ("wire", "hash", "int_hashes", "data_parallel_rank", "group_idx", "sliding_window",
         "extra_keys")


def _config(what, fields):
    """A bkv_vllm_config: bkv_vllm_config_init's defaults, then fields.
    Returns (config, strings): the encoded strings must stay referenced
    while the config is used."""
    cfg = _ffi.bkv_vllm_config()
    _lib.bkv_vllm_config_init(ctypes.byref(cfg))
    keep = []
    for k, v in fields.items():
        if k in _STRINGS:
            if v is not None:
                v = v.encode() if isinstance(v, str) else bytes(v)
                if b"\0" in v:
                    raise InvalidArgumentError("%s: %s contains a NUL byte" % (what, k),
                                               _ffi.BKV_EINVAL)
                keep.append(v)
            setattr(cfg, k, v)
        elif k in _INTS:
            v = int(v)
            if k in ("data_parallel_rank", "group_idx"):
                if not -2**31 <= v < 2**31:
                    raise InvalidArgumentError("%s: %s out of range" % (what, k),
                                               _ffi.BKV_EINVAL)
            elif not 0 <= v < 2**32:
                raise InvalidArgumentError("%s: %s out of range" % (what, k), _ffi.BKV_EINVAL)
            setattr(cfg, k, v)
        else:
            raise TypeError("%s: unknown field %r" % (what, k))
    return cfg, keep


class VllmEncoder:
    """A vLLM KV-event encoder over one Pool (bkv_vllm_encoder_create).

    Keyword arguments are bkv_vllm_config fields; unset ones keep
    bkv_vllm_config_init's defaults:

        wire                VllmWire.MAP
        hash                VllmHash.SHA256_CBOR
        int_hashes          True  (a digest goes out as the int of its last 8
                                   bytes; False: as the 32 bytes)
        hash_seed           "0"   (the replicas' PYTHONHASHSEED)
        medium              "GPU" (None sends nil)
        host_medium         "CPU" (the host cache's blocks; None sends nil)
        data_parallel_rank  -1    (omitted)
        group_idx           -1    (omitted; MAP only)
        spec_kind           None  (omitted; MAP only)
        sliding_window      0     (omitted; MAP only)
        extra_keys          False (MAP only)
        key_name            None, or a callable key -> str | bytes | None
                            naming a pool key (a LoRA adapter) for vLLM; it
                            is called on this thread from inside encode() and
                            kept alive as long as the encoder.

    The pool must have events on (Pool(event_capacity=N), N > 0). Raises
    InvalidArgumentError (a field out of range, a pool without events, a
    hash_seed over 255 bytes), OutOfMemoryError. Use as a context manager or
    call close().
    """

    def __init__(self, pool, key_name=None, **config):
        if key_name is not None and not callable(key_name):
            raise TypeError("VllmEncoder: key_name must be callable or None")
        cfg, keep = _config("VllmEncoder", config)
        self._h = None
        self._pool = None
        self._names = []     # this encode's key names (valid until it returns)
        self._error = None   # an exception key_name raised during encode
        self._key_name = key_name
        self._cb = None
        if key_name is not None:
            self._cb = _ffi.bkv_vllm_key_name_fn(self._name_of)
            cfg.key_name = self._cb
        h = ctypes.c_void_p()
        check(_lib.bkv_vllm_encoder_create(ctypes.byref(cfg), pool._p(), None, ctypes.byref(h)),
              "bkv_vllm_encoder_create")
        del keep  # the library copied the strings
        self._h = h
        self._pool = pool
        pool._users += 1
        self.wire = VllmWire(cfg.wire)
        self.hash = VllmHash(cfg.hash)
        self.last_event_count = 0

    def _name_of(self, ud, key):
        # Called by the library inside bkv_vllm_encoder_drain. No exception may
        # cross into C: keep the first one and raise it after the call.
        if self._error is not None:
            return None
        try:
            name = self._key_name(key)
            if name is None:
                return None
            b = name.encode() if isinstance(name, str) else bytes(name)
            if b"\0" in b:
                raise ValueError("VllmEncoder: key_name(%d) contains a NUL byte" % key)
            buf = ctypes.create_string_buffer(b)
            self._names.append(buf)
            return ctypes.addressof(buf)
        except BaseException as e:  # noqa: B902 - re-raised by encode()
            self._error = e
            return None

    # -- lifetime ---------------------------------------------------------
    def close(self):
        """Destroy the encoder (bkv_vllm_encoder_destroy). Idempotent."""
        if self._h:
            _lib.bkv_vllm_encoder_destroy(self._h)
            self._h = None
            self._pool._users -= 1
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()

    def _e(self):
        if not self._h:
            raise StateError("VllmEncoder: closed", _ffi.BKV_ESTATE)
        return self._h

    # -- encoding ---------------------------------------------------------
    def encode(self, pool, ts=None):
        """Drain every pending event of pool and encode them as one vLLM
        KVEventBatch (bkv_vllm_encoder_drain): the msgpack payload of one ZeroMQ
        message, as bytes (a copy), or b"" when there was nothing to send.
        ts is KVEventBatch.ts in seconds (default time.time(), as vLLM).
        last_event_count is set to the number of vLLM events in the batch.

        Raises InvalidArgumentError for another pool than the encoder's,
        StateError when called during the pool's scheduler step or after
        close(), OutOfMemoryError (the drained events are lost; the next
        batch resynchronises), and re-raises what key_name raised (the
        batch is lost then too, and the next one resynchronises only if the
        library saw a gap: name keys without failing)."""
        e = self._e()
        if pool is not self._pool:
            raise InvalidArgumentError("VllmEncoder.encode: not the encoder's pool",
                                       _ffi.BKV_EINVAL)
        msg = ctypes.POINTER(ctypes.c_uint8)()
        n = ctypes.c_size_t()
        self._names.clear()
        self._error = None
        try:
            rc = _lib.bkv_vllm_encoder_drain(e, pool._p(), time.time() if ts is None else float(ts),
                                      ctypes.byref(msg), ctypes.byref(n))
        finally:
            self._names.clear()
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        self.last_event_count = check(rc, "bkv_vllm_encoder_drain")
        if not n.value:
            return b""
        return ctypes.string_at(msg, n.value)

    @property
    def resyncs(self):
        """Resynchronisations written so far (bkv_vllm_encoder_resyncs): ring
        overflows and buffer failures, each sent as AllBlocksCleared and a
        snapshot of the index."""
        return _lib.bkv_vllm_encoder_resyncs(self._e())

    def __repr__(self):
        return "VllmEncoder(wire=%s, hash=%s%s)" % (self.wire.name, self.hash.name,
                                                     "" if self._h else ", closed")


def vllm_block_hashes(tokens, block_tokens, hash=VllmHash.SHA256_CBOR, hash_seed="0",
                      lora_name=None, cache_salt=None):
    """vLLM's block digests of the full blocks of tokens
    (bkv_vllm_block_hashes, bkv_vllm_block_hashes_salted): what a vLLM
    replica with this hash function, PYTHONHASHSEED and block size computes,
    and what a VllmEncoder with the same settings publishes for a pool
    holding these tokens. Returns a list of len(tokens) // block_tokens
    32-byte digests (bytes). lora_name is every block's extra key, cache_salt
    the first block's (None: none; an encoder salts a key its key_name does
    not name with the key's decimal digits, str(key)). InvalidArgumentError
    for a NATIVE hash, block_tokens 0 or a bad hash_seed."""
    import numpy as np

    cfg, keep = _config("vllm_block_hashes", {"hash": hash, "hash_seed": hash_seed})
    t = np.ascontiguousarray(tokens, dtype=np.int32)
    bt = int(block_tokens)
    want = len(t) // bt if bt > 0 else 0
    if bt <= 0 or VllmHash(cfg.hash) == VllmHash.NATIVE:
        raise InvalidArgumentError("vllm_block_hashes: block_tokens > 0 and a SHA-256 hash "
                                   "are needed", _ffi.BKV_EINVAL)
    if want == 0:
        return []
    lora, salt = (None if v is None else v.encode() if isinstance(v, str) else bytes(v)
                  for v in (lora_name, cache_salt))
    out = (ctypes.c_uint8 * (want * DIGEST_BYTES))()
    ptr = t.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
    if salt is None:
        n = _lib.bkv_vllm_block_hashes(ctypes.byref(cfg), lora, bt, ptr, len(t), out)
    else:
        n = _lib.bkv_vllm_block_hashes_salted(ctypes.byref(cfg), lora, salt, bt, ptr, len(t), out)
    del keep
    if n != want:
        raise InvalidArgumentError("vllm_block_hashes: bad input (hash_seed over 255 bytes?)",
                                   _ffi.BKV_EINVAL)
    raw = bytes(out)
    return [raw[i * DIGEST_BYTES:(i + 1) * DIGEST_BYTES] for i in range(n)]


def vllm_hash_int(digest):
    """The int a digest is sent as when int_hashes is set
    (bkv_vllm_hash_int): its last 8 bytes, big-endian."""
    d = bytes(digest)
    if len(d) != DIGEST_BYTES:
        raise InvalidArgumentError("vllm_hash_int: a digest is %d bytes" % DIGEST_BYTES,
                                   _ffi.BKV_EINVAL)
    buf = (ctypes.c_uint8 * DIGEST_BYTES).from_buffer_copy(d)
    return _lib.bkv_vllm_hash_int(buf)
