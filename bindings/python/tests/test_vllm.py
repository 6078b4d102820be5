"""batchkv.VllmEncoder: a pool's KV events as vLLM KVEventBatch bytes.

Two pools get the same calls; one is drained with Pool.events(), the other
through a VllmEncoder, at the same points. Each batch is decoded (with
python3-msgpack when it is installed, else with the small decoder below,
and with both when both are there, which must agree) and its events are
compared with the pool's own: kinds, counts, hashes (NATIVE: the pool's
hashes themselves; SHA256_CBOR: vllm_block_hashes of the tokens), token ids,
lora ids and names."""
import struct

import pytest

import batchkv
from batchkv import EventKind, VllmEncoder, VllmHash, VllmWire

try:
    import msgpack
except ImportError:  # Debian: python3-msgpack
    msgpack = None

BT = 4


def _unpack(b, i=0):
    """A minimal msgpack decoder (the forms msgspec writes): (value, next)."""
    t = b[i]
    i += 1
    if t <= 0x7f:
        return t, i
    if t >= 0xe0:
        return t - 0x100, i
    if 0x80 <= t <= 0x8f or t in (0xde, 0xdf):
        n, i = (t & 0x0f, i) if t <= 0x8f else \
            (struct.unpack_from(">H" if t == 0xde else ">I", b, i)[0], i + (2 if t == 0xde else 4))
        d = {}
        for _ in range(n):
            k, i = _unpack(b, i)
            d[k], i = _unpack(b, i)
        return d, i
    if 0x90 <= t <= 0x9f or t in (0xdc, 0xdd):
        n, i = (t & 0x0f, i) if t <= 0x9f else \
            (struct.unpack_from(">H" if t == 0xdc else ">I", b, i)[0], i + (2 if t == 0xdc else 4))
        out = []
        for _ in range(n):
            v, i = _unpack(b, i)
            out.append(v)
        return out, i
    if 0xa0 <= t <= 0xbf:
        n = t & 0x1f
        return b[i:i + n].decode(), i + n
    fixed = {0xc0: None, 0xc2: False, 0xc3: True}
    if t in fixed:
        return fixed[t], i
    sizes = {0xcc: ">B", 0xcd: ">H", 0xce: ">I", 0xcf: ">Q", 0xd0: ">b", 0xd1: ">h", 0xd2: ">i",
             0xd3: ">q", 0xca: ">f", 0xcb: ">d"}
    if t in sizes:
        return struct.unpack_from(sizes[t], b, i)[0], i + struct.calcsize(sizes[t])
    lens = {0xd9: ">B", 0xda: ">H", 0xdb: ">I", 0xc4: ">B", 0xc5: ">H", 0xc6: ">I"}
    if t in lens:
        n = struct.unpack_from(lens[t], b, i)[0]
        i += struct.calcsize(lens[t])
        raw = b[i:i + n]
        return (raw.decode() if t in (0xd9, 0xda, 0xdb) else bytes(raw)), i + n
    raise ValueError("msgpack byte 0x%02x not expected" % t)


def decode(payload):
    v, end = _unpack(payload)
    assert end == len(payload)
    if msgpack is not None:
        assert msgpack.unpackb(payload, raw=False, strict_map_key=False) == v
    return v


STORED = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
          "lora_name"]


def events_of(batch, wire):
    """[(type, {field: value})] of a decoded batch, whatever the layout."""
    if wire == VllmWire.MAP:
        assert set(batch) <= {"ts", "events", "data_parallel_rank"}
        return [(e["type"], e) for e in batch["events"]]
    out = []
    for e in batch[1]:
        names = {"BlockStored": STORED, "BlockRemoved": ["block_hashes", "medium"],
                 "AllBlocksCleared": []}[e[0]]
        assert len(e) == 1 + len(names), e
        out.append((e[0], dict(zip(names, e[1:]))))
    return out


def tokens(base, n):
    return list(range(base, base + n))


# (name, action) phases; both pools get the same ones. 16 blocks of 4
# tokens: A fills 8 and stays cached, B needs 10 and evicts 2 of A's, a
# keyed C shares nothing with A (another key), the reset clears the cache.
PHASES = [
    ("A", lambda p: _run(p, 0, tokens(100, 32))),
    ("B", lambda p: _run(p, 0, tokens(500, 40))),
    ("C", lambda p: _run(p, 7, tokens(100, 8))),
    ("reset", lambda p: p.reset_cache()),
]


def _run(pool, key, toks):
    s = pool.open(key)
    pool.append(s, toks[:len(toks) // 2])
    pool.append(s, toks[len(toks) // 2:])
    pool.close_seq(s)


def make_pool():
    return batchkv.Pool(device_blocks=16, block_tokens=BT, event_capacity=256)


@pytest.mark.parametrize("wire", [VllmWire.MAP, VllmWire.ARRAY])
def test_native_hashes_replay_the_pools_own_events(wire):
    ref, pool = make_pool(), make_pool()
    names = {7: "adapter-7"}
    with VllmEncoder(pool, wire=wire, hash=VllmHash.NATIVE, data_parallel_rank=3,
                     key_name=names.get) as enc:
        assert enc.encode(pool, 1.0) == b"" and enc.last_event_count == 0
        seen = {EventKind.STORED: 0, EventKind.REMOVED: 0, EventKind.CLEARED: 0}
        for i, (_, act) in enumerate(PHASES):
            act(ref)
            act(pool)
            mine = ref.events()
            for e in mine:
                seen[e.kind] += 1
            payload = enc.encode(pool, 10.0 + i)
            assert payload
            batch = decode(payload)
            evs = events_of(batch, wire)
            assert enc.last_event_count == len(evs)
            if wire == VllmWire.MAP:
                assert batch["ts"] == 10.0 + i and batch["data_parallel_rank"] == 3
            else:
                assert batch[0] == 10.0 + i and batch[2] == 3
            stored = [e for e in mine if e.kind == EventKind.STORED]
            removed = [e for e in mine if e.kind == EventKind.REMOVED]
            cleared = [e for e in mine if e.kind == EventKind.CLEARED]
            got_stored = [f for t, f in evs if t == "BlockStored"]
            got_removed = [f for t, f in evs if t == "BlockRemoved"]
            assert sum(1 for t, _ in evs if t == "AllBlocksCleared") == len(cleared)
            assert len(got_removed) == len(removed)
            assert [f["block_hashes"] for f in got_removed] == [[e.hash] for e in removed]
            assert [h for f in got_stored for h in f["block_hashes"]] == [e.hash for e in stored]
            assert sum(len(f["token_ids"]) for f in got_stored) == BT * len(stored)
            for f in got_stored:
                assert f["block_size"] == BT and f["medium"] == "GPU"
                key = {e.hash: e.key for e in stored}[f["block_hashes"][0]]
                assert f["lora_id"] == (key or None)
                assert f["lora_name"] == names.get(key)
        assert enc.resyncs == 0
        assert seen == {EventKind.STORED: 20, EventKind.REMOVED: 4, EventKind.CLEARED: 1}
    assert [name for name, _ in PHASES] == ["A", "B", "C", "reset"]
    assert ref.stats().events == pool.stats().events > 0
    ref.close()
    pool.close()


def test_sha256_cbor_hashes_are_vllms():
    pool = make_pool()
    enc = VllmEncoder(pool, wire=VllmWire.ARRAY, hash_seed="42")
    toks = tokens(100, 32)
    _run(pool, 0, toks)
    evs = events_of(decode(enc.encode(pool)), VllmWire.ARRAY)
    want = [batchkv.vllm_hash_int(d) for d in batchkv.vllm_block_hashes(toks, BT, hash_seed="42")]
    assert len(want) == 8
    assert [h for t, f in evs if t == "BlockStored" for h in f["block_hashes"]] == want
    assert [x for t, f in evs if t == "BlockStored" for x in f["token_ids"]] == toks
    assert evs[0][1]["parent_block_hash"] is None
    # the 32-byte digests themselves when int_hashes is off
    enc.close()
    pool.reset_cache()
    pool.events()
    with VllmEncoder(pool, wire=VllmWire.ARRAY, hash_seed="42", int_hashes=False) as enc2:
        _run(pool, 0, toks)
        evs = events_of(decode(enc2.encode(pool)), VllmWire.ARRAY)
        assert evs[0][0] == "AllBlocksCleared"  # created after events: a snapshot
        got = [h for t, f in evs if t == "BlockStored" for h in f["block_hashes"]]
        assert got == batchkv.vllm_block_hashes(toks, BT, hash_seed="42")
        assert enc2.resyncs == 1
    pool.close()


def test_an_unnamed_key_is_the_first_blocks_cache_salt():
    pool = make_pool()
    with VllmEncoder(pool, wire=VllmWire.ARRAY, hash_seed="42") as enc:
        toks = tokens(100, 16)
        _run(pool, 0, toks)
        _run(pool, 5, toks)  # the same tokens under key 5, which has no name
        evs = events_of(decode(enc.encode(pool)), VllmWire.ARRAY)
        got = [f["block_hashes"] for t, f in evs if t == "BlockStored"]
        plain = batchkv.vllm_block_hashes(toks, BT, hash_seed="42")
        salted = batchkv.vllm_block_hashes(toks, BT, hash_seed="42", cache_salt="5")
        assert got == [[batchkv.vllm_hash_int(d) for d in plain],
                       [batchkv.vllm_hash_int(d) for d in salted]]
        assert not set(plain) & set(salted)
    pool.close()


def test_errors():
    with pytest.raises(batchkv.InvalidArgumentError):
        VllmEncoder(batchkv.Pool(device_blocks=8))  # events off
    pool, other = make_pool(), make_pool()
    with pytest.raises(batchkv.InvalidArgumentError):
        VllmEncoder(pool, hash_seed="x" * 256)
    with pytest.raises(batchkv.InvalidArgumentError):
        VllmEncoder(pool, wire=7)
    with pytest.raises(batchkv.InvalidArgumentError):
        VllmEncoder(pool, medium="G\0PU")
    with pytest.raises(TypeError):
        VllmEncoder(pool, no_such_field=1)
    enc = VllmEncoder(pool)
    with pytest.raises(batchkv.InvalidArgumentError):
        enc.encode(other)
    with pytest.raises(batchkv.StateError):
        pool.close()  # the encoder still uses it
    enc.close()
    enc.close()
    with pytest.raises(batchkv.StateError):
        enc.encode(pool)
    pool.close()
    other.close()
    with pytest.raises(batchkv.InvalidArgumentError):
        batchkv.vllm_block_hashes([1, 2, 3, 4], 4, hash=VllmHash.NATIVE)
    assert batchkv.vllm_block_hashes([1, 2, 3], 4) == []
    assert batchkv.vllm_hash_int(bytes(range(32))) == int.from_bytes(bytes(range(24, 32)), "big")


def test_key_name_exception_is_raised_from_encode():
    pool = make_pool()

    def bad(key):
        raise KeyError(key)
    with VllmEncoder(pool, key_name=bad) as enc:
        _run(pool, 9, tokens(1, 8))
        with pytest.raises(KeyError):
            enc.encode(pool)
        _run(pool, 0, tokens(50, 8))  # unkeyed: key_name is not called
        assert enc.encode(pool)
    pool.close()


def test_encode_during_a_step_is_refused():
    pool = batchkv.Pool(device_blocks=32, event_capacity=64)
    enc = VllmEncoder(pool)
    seen = []

    class Host:
        def forward(self, batch, next_tokens):
            try:
                enc.encode(pool)
            except batchkv.StateError as e:
                seen.append(e)
            next_tokens[:] = 1

    sched = batchkv.Scheduler(pool, Host())
    sched.submit(tokens(10, 20), max_new_tokens=2)
    sched.run()
    assert seen
    sched.close()
    assert enc.encode(pool)  # between steps: the run's blocks
    enc.close()
    pool.close()
