#!/usr/bin/python3
"""kvevents_check.py - decode libbatchkv's vLLM KV events with vLLM's schema.

Runs tests/kvevents_dump (the events workload through a bkv_vllm_encoder) in
several encoder configurations and, for every batch it wrote:

- decodes it with python3-msgpack and checks the layout field by field
  against vLLM's structs (vllm/distributed/kv_events.py: the current map
  layout with its "type" tag and omitted defaults, or the older array_like
  one), and that msgpack re-encodes the decoded value to the same bytes
  (msgspec and msgpack-python both write the shortest forms, so this is the
  byte-for-byte check);
- recomputes every stored block's hash from the event's token ids the way
  vLLM's hash_block_tokens does (sha256 of cbor2.dumps(..., canonical=True)
  or of pickle.dumps(..., protocol=5), the first parent NONE_HASH =
  hash(PYTHONHASHSEED)) and compares it with the published one;
- rebuilds the replica's block set from the events alone (add on
  BlockStored, remove on BlockRemoved, empty on AllBlocksCleared) and
  compares it with the pool's real index after every drain.

Exit 77 (skipped) when python3-msgpack or python3-cbor2 is missing.
"""
import hashlib
import pickle
import struct
import subprocess
import sys

try:
    import cbor2
    import msgpack
except ImportError as e:  # pragma: no cover
    print(f"skip: {e}")
    sys.exit(77)

STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                 "lora_id", "medium", "lora_name"]
STORED_OPTIONAL = ["extra_keys", "group_idx", "kv_cache_spec_kind",
                   "kv_cache_spec_sliding_window"]
REMOVED_FIELDS = ["block_hashes", "medium"]
REMOVED_OPTIONAL = ["group_idx"]
LORA = {7: "adapter-7", 9: "adapter-9"}


def fail(msg):
    raise AssertionError(msg)


def hash_fn(kind):
    if kind == "cbor":
        return lambda obj: hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()
    if kind == "pickle":
        return lambda obj: hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    return None


def check_fields(ev, required, optional, what):
    keys = list(ev.keys())
    if keys[0] != "type":
        fail(f"{what}: first key {keys[0]!r}, want 'type'")
    want = ["type"] + required + [k for k in optional if k in ev]
    if keys != want:
        fail(f"{what}: keys {keys}, want {want}")
    for k in optional:
        if k in ev and ev[k] is None:
            fail(f"{what}: default {k}=None should be omitted")


def block_extra_keys(lora_id, lora_name, parent, n):
    """Each of n chained blocks' extra keys, the first block's parent being
    parent: the LoRA name on every block of a named key; an unnamed nonzero
    key is vLLM's cache_salt (its decimal digits) on a chain's first block
    only (generate_block_hash_extra_keys)."""
    if lora_name is not None:
        return [(lora_name,)] * n
    salted = lora_id is not None and lora_id != 0 and parent is None
    return [(str(lora_id),) if salted and k == 0 else None for k in range(n)]


def read_records(data):
    i = 0
    while i < len(data):
        tag = data[i:i + 1]
        i += 1
        if tag == b"B":
            (n,) = struct.unpack_from("<I", data, i)
            i += 4
            yield "B", data[i:i + n]
            i += n
        elif tag == b"T":
            (n,) = struct.unpack_from("<I", data, i)
            i += 4
            yield "T", [data[i + 32 * k:i + 32 * k + 32] for k in range(n)]
            i += 32 * n
        elif tag == b"S":
            yield "S", struct.unpack_from("<6Q", data, i)
            i += 48
        elif tag == b"R":
            yield "R", None
        else:
            fail(f"bad record tag {tag!r} at {i - 1}")


def run(dump, wire, hkind, int_hashes, extra, dp, group, kind, seed, rounds=0):
    label = f"{wire}/{hkind}/int={int_hashes}/extra={extra}/dp={dp}/group={group}/kind={kind}/seed={seed}"
    if rounds:
        label = f"random pool ops x{rounds}: {wire}/{hkind}"
        args = [dump, "random", wire, hkind, str(rounds)]
    else:
        args = [dump, wire, hkind, str(int_hashes), str(extra), str(dp), str(group), kind, seed]
    out = subprocess.run(args, check=True, capture_output=True).stdout
    fn = hash_fn(hkind)
    as_int = hkind == "native" or wire == "array0" or int_hashes == 1
    none_hash = fn(seed) if fn else None
    full = {}     # published hash -> full 32-byte digest (for parents)
    have = set()  # published hashes the events say the replica holds
    host = set()  # the same on the host medium (a host cache's blocks)
    host_stores = 0
    batches = stores = removes = clears = checks = 0
    stats = None

    def pub(d):
        return int.from_bytes(d[-8:], "big") if as_int else d

    for tag, rec in read_records(out):
        if tag == "B":
            batches += 1
            obj = msgpack.unpackb(rec, raw=False, strict_map_key=False)
            if msgpack.packb(obj, use_bin_type=True) != rec:
                fail(f"{label}: batch {batches} is not in shortest msgpack form")
            if wire == "map":
                if not isinstance(obj, dict):
                    fail(f"{label}: batch is not a map")
                want = ["ts", "events"] + (["data_parallel_rank"] if dp >= 0 else [])
                if list(obj.keys()) != want:
                    fail(f"{label}: batch keys {list(obj.keys())}, want {want}")
                if dp >= 0 and obj["data_parallel_rank"] != dp:
                    fail(f"{label}: data_parallel_rank {obj['data_parallel_rank']}")
                ts, events = obj["ts"], obj["events"]
                # msgspec writes floats as float64 (0xcb)
                if rec[1:4] != b"\xa2ts" or rec[4] != 0xcb:
                    fail(f"{label}: ts is not the first entry as a float64")
            else:
                want_len = 3 if wire == "array" and dp >= 0 else 2
                if not isinstance(obj, list) or len(obj) != want_len:
                    fail(f"{label}: array batch has {len(obj)} entries, want {want_len}")
                if want_len == 3 and obj[2] != dp:
                    fail(f"{label}: data_parallel_rank {obj[2]}")
                ts, events = obj[0], obj[1]
            if not isinstance(ts, float) or not events:
                fail(f"{label}: bad ts or empty events")
            for ev in events:
                if wire == "map":
                    t = ev["type"]
                    if t == "BlockStored":
                        check_fields(ev, STORED_FIELDS, STORED_OPTIONAL, label)
                        hashes, parent, toks = ev["block_hashes"], ev["parent_block_hash"], ev["token_ids"]
                        bsize, lora_id, lora_name = ev["block_size"], ev["lora_id"], ev["lora_name"]
                        medium = ev["medium"]
                        if (group >= 0) != ("group_idx" in ev) or ev.get("group_idx", group) != group:
                            fail(f"{label}: group_idx")
                        if (kind != "-") != ("kv_cache_spec_kind" in ev):
                            fail(f"{label}: kv_cache_spec_kind")
                        if extra:
                            want_ek = [None if k is None else list(k)
                                       for k in block_extra_keys(lora_id, lora_name,
                                                                 ev["parent_block_hash"],
                                                                 len(ev["block_hashes"]))]
                            if ev["extra_keys"] != want_ek:
                                fail(f"{label}: extra_keys {ev['extra_keys']}")
                        elif "extra_keys" in ev:
                            fail(f"{label}: extra_keys sent though off")
                    elif t == "BlockRemoved":
                        check_fields(ev, REMOVED_FIELDS, REMOVED_OPTIONAL, label)
                        hashes, medium = ev["block_hashes"], ev["medium"]
                    elif t == "AllBlocksCleared":
                        if list(ev.keys()) != ["type"]:
                            fail(f"{label}: AllBlocksCleared has fields {list(ev.keys())}")
                    else:
                        fail(f"{label}: unknown event type {t!r}")
                else:
                    t = ev[0]
                    v0 = wire == "array0"
                    if t == "BlockStored":
                        if len(ev) != (6 if v0 else 8):
                            fail(f"{label}: array BlockStored has {len(ev)} entries")
                        _, hashes, parent, toks, bsize, lora_id = ev[:6]
                        lora_name = LORA.get(lora_id) if v0 else ev[7]
                        medium = "GPU" if v0 else ev[6]
                    elif t == "BlockRemoved":
                        if len(ev) != (2 if v0 else 3):
                            fail(f"{label}: array BlockRemoved {ev!r}")
                        hashes, medium = ev[1], "GPU" if v0 else ev[2]
                    elif t == "AllBlocksCleared":
                        if len(ev) != 1:
                            fail(f"{label}: array AllBlocksCleared has {len(ev)} entries")
                    else:
                        fail(f"{label}: unknown event tag {t!r}")
                for h in hashes if t != "AllBlocksCleared" else []:
                    if as_int and not (isinstance(h, int) and 0 <= h < 1 << 64):
                        fail(f"{label}: hash {h!r} is not a uint64")
                    if not as_int and not (isinstance(h, bytes) and len(h) == 32):
                        fail(f"{label}: hash {h!r} is not 32 bytes")
                if t == "BlockStored":
                    stores += 1
                    if bsize != 4 or len(toks) != bsize * len(hashes) or not hashes:
                        fail(f"{label}: {len(toks)} tokens for {len(hashes)} blocks of {bsize}")
                    if lora_name != LORA.get(lora_id) if lora_id is not None else lora_name is not None:
                        fail(f"{label}: lora_id {lora_id} with lora_name {lora_name!r}")
                    if fn:
                        if parent is None:
                            prev = none_hash
                        elif parent in full:
                            prev = full[parent]
                        else:
                            fail(f"{label}: parent {parent!r} was never stored")
                        eks = block_extra_keys(lora_id, lora_name, parent, len(hashes))
                        for k, h in enumerate(hashes):
                            d = fn((prev, tuple(toks[k * bsize:(k + 1) * bsize]), eks[k]))
                            if pub(d) != h:
                                fail(f"{label}: block hash {h!r} != vLLM's {pub(d)!r}")
                            full[h] = d
                            prev = d
                    elif parent is not None and parent not in have and parent not in host:
                        fail(f"{label}: parent {parent} not held")
                    held = have if medium == "GPU" else host
                    for h in hashes:
                        if h in held:
                            fail(f"{label}: {h!r} stored twice on {medium}")
                        held.add(h)
                elif t == "BlockRemoved":
                    removes += 1
                    held = have if medium == "GPU" else host
                    for h in hashes:
                        if h not in held:
                            fail(f"{label}: removed {h!r} not held on {medium}")
                        held.discard(h)
                else:
                    clears += 1
                    have.clear()
                    host.clear()
                if t != "AllBlocksCleared" and medium not in ("GPU", "CPU"):
                    fail(f"{label}: medium {medium!r}")
                if t == "BlockStored" and medium == "CPU":
                    host_stores += 1
        elif tag == "T":
            truth = {pub(d) for d in rec}
            if len(truth) != len(rec):
                fail(f"{label}: duplicate hashes in the index")
            if truth != have:
                fail(f"{label}: rebuilt set ({len(have)}) != pool index ({len(truth)}): "
                     f"{len(have - truth)} extra, {len(truth - have)} missing")
            checks += 1
        elif tag == "R":
            have.clear()  # a new replica
            host.clear()
            full.clear()
        else:
            stats = rec
    ev_, swap_out, preempt, swaps, dropped, resyncs = stats
    if rounds:
        print(f"{label}: {batches} batches, {stores} stored, {removes} removed, {clears} cleared, "
              f"{checks} index checks equal; pools: {ev_} events, {swap_out} evictions, "
              f"{dropped} events dropped, {resyncs} resyncs")
        print(f"{label}: {host_stores} host-cache stores")
        # array0 has no medium: the host tier is not published there, and
        # the device set alone must replay to the index
        host_ok = host_stores == 0 if wire == "array0" else host_stores > rounds
        if not (removes > 15 * rounds and clears >= rounds and dropped > 0 and resyncs >= 1
                and checks > 80 * rounds and host_ok):
            fail(f"{label}: the random workloads did not reach removals, resets, overflow "
                 "and the host cache")
        return
    print(f"{label}: {batches} batches, {stores} stored, {removes} removed, {clears} cleared, "
          f"{checks} index checks equal; pool: {ev_} evictions, {swap_out} blocks swapped out, "
          f"{preempt} preemptions ({swaps} by swap), {dropped} events dropped, {resyncs} resyncs")
    # the run must have gone through what it claims to test
    if not (ev_ > 0 and swap_out > 0 and preempt > swaps > 0 and dropped > 0 and resyncs >= 1
            and removes > 0 and clears >= 2 and checks > 100):
        fail(f"{label}: the workload did not exercise evictions/swap/recompute/overflow/reset")


def check_hashes(dump):
    """bkv_vllm_block_hashes against vLLM's functions, for block sizes that
    reach every CBOR and pickle integer width, a LoRA extra key, a cache_salt
    (the first block's extra key, alone or after the LoRA name), a long seed
    and (20000 tokens per block) pickle frames split at 64 KiB."""
    import random
    rnd = random.Random(7)
    values = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, -1, -24, -25, -256, -65537, -2**31]
    cases = 0
    for kind in ("cbor", "pickle"):
        fn = hash_fn(kind)
        for bt, nblocks, lora, seed, salt in [
                (1, 5, None, "0", None), (2, 3, "adapter-7", "0", None), (3, 3, None, "99", None),
                (16, 6, None, "0", None), (16, 4, "a" * 300, "s" * 255, None),
                (255, 2, None, "0", None), (256, 2, "x", "12345", None),
                (20000, 2, None, "0", None), (4, 3, None, "0", "5"),
                (4, 3, "adapter-9", "0", "18446744073709551615"), (2, 2, None, "7", "t" * 300)]:
            toks = [rnd.choice(values) if rnd.random() < 0.3 else rnd.randrange(0, 200000)
                    for _ in range(bt * nblocks + bt // 2)]
            out = subprocess.run([dump, "hash", kind, seed, str(bt), lora or "-"]
                                 + ([salt] if salt else []), check=True,
                                 capture_output=True, input=" ".join(map(str, toks)).encode()).stdout
            got = out.decode().split()
            prev = fn(seed)
            want = []
            for k in range(nblocks):
                ek = ((lora,) if lora else ()) + ((salt,) if salt and k == 0 else ())
                prev = fn((prev, tuple(toks[k * bt:(k + 1) * bt]), ek or None))
                want.append(prev.hex())
            if got != want:
                fail(f"hash {kind} bt={bt} lora={lora!r} salt={salt!r} seed={seed!r}: "
                     f"{got[:1]} != {want[:1]}")
            cases += 1
    print(f"bkv_vllm_block_hashes: {cases} cases equal to vLLM's sha256_cbor and sha256 (pickle)")


def main():
    dump = sys.argv[1]
    check_hashes(dump)
    run(dump, "map", "cbor", 1, 0, -1, -1, "-", "0")
    run(dump, "map", "cbor", 0, 1, 3, 0, "full_attention", "1234")
    run(dump, "map", "pickle", 1, 0, 0, -1, "-", "0")
    run(dump, "map", "pickle", 0, 1, -1, 1, "sliding_window", "42")
    run(dump, "map", "native", 1, 0, -1, -1, "-", "0")
    run(dump, "array", "cbor", 1, 0, -1, -1, "-", "0")
    run(dump, "array", "cbor", 0, 0, 1, -1, "-", "7")
    run(dump, "array0", "cbor", 1, 0, -1, -1, "-", "0")
    run(dump, "array0", "native", 1, 0, -1, -1, "-", "0")
    # forks, truncates, drops, transactions and drains 1..12 operations apart
    # (stores evicted before a drain, ring overflows)
    run(dump, "map", "cbor", 1, 0, -1, -1, "-", "0", rounds=30)
    run(dump, "map", "pickle", 1, 0, -1, -1, "-", "0", rounds=10)
    run(dump, "array", "native", 1, 0, -1, -1, "-", "0", rounds=10)
    run(dump, "array0", "cbor", 1, 0, -1, -1, "-", "0", rounds=10)
    print("ok")


if __name__ == "__main__":
    main()
