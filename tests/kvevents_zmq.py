#!/usr/bin/python3
"""kvevents_zmq.py - follow a libbatchkv replica over ZeroMQ as a vLLM router would.

Starts examples/events' bkv-kv-publisher (the events workload: evictions, swap
and recompute preemption, a pool event ring that overflows on steps 30..39, a
cache reset at step 60), subscribes to its PUB socket with vLLM's framing
(topic, 8-byte big-endian seq, msgpack KVEventBatch), and:

- decodes every batch with vLLM's current field layout and checks each stored
  block's hash against vLLM's sha256_cbor recomputed from the token ids;
- detects gaps in seq - the slow-joiner loss at the start, and one message in
  17 that it drops on purpose - and fills them from the ROUTER replay socket
  (request: 8-byte big-endian start seq; answer: every buffered batch from
  there, then seq -1);
- rebuilds the replica's block set from the events alone and compares it with
  the pool's real index (published by the example on a separate oracle
  socket) after every drain.

Exit 77 (skipped) without python3-zmq, python3-msgpack or python3-cbor2, or
when the publisher was not built (no libzmq).
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import zmq
    import msgpack
    import kvevents_check as kc  # needs cbor2 too
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class Follower:
    """One replica's block set, rebuilt from its KVEventBatch stream."""

    def __init__(self, seed):
        self.fn = kc.hash_fn("cbor")
        self.none = self.fn(seed)
        self.have = set()
        self.full = {}
        self.expected = 0
        self.snaps = {-1: frozenset()}
        self.clears = self.stores = self.removes = 0

    def apply(self, seq, payload):
        obj = msgpack.unpackb(payload, raw=False)
        if msgpack.packb(obj, use_bin_type=True) != payload:
            kc.fail(f"batch {seq}: not in shortest msgpack form")
        if list(obj.keys()) != ["ts", "events", "data_parallel_rank"] or obj["data_parallel_rank"] != 0:
            kc.fail(f"batch {seq}: keys {list(obj.keys())}")
        for ev in obj["events"]:
            t = ev["type"]
            if t == "BlockStored":
                kc.check_fields(ev, kc.STORED_FIELDS, kc.STORED_OPTIONAL, f"batch {seq}")
                bs, name = ev["block_size"], ev["lora_name"]
                prev = self.none if ev["parent_block_hash"] is None else self.full[ev["parent_block_hash"]]
                for k, h in enumerate(ev["block_hashes"]):
                    d = self.fn((prev, tuple(ev["token_ids"][k * bs:(k + 1) * bs]),
                                 (name,) if name else None))
                    if int.from_bytes(d[-8:], "big") != h:
                        kc.fail(f"batch {seq}: hash {h} is not vLLM's")
                    if h in self.have:
                        kc.fail(f"batch {seq}: {h} stored twice")
                    self.full[h] = prev = d
                    self.have.add(h)
                self.stores += 1
            elif t == "BlockRemoved":
                kc.check_fields(ev, kc.REMOVED_FIELDS, kc.REMOVED_OPTIONAL, f"batch {seq}")
                for h in ev["block_hashes"]:
                    if h not in self.have:
                        kc.fail(f"batch {seq}: removed {h} not held")
                    self.have.discard(h)
                self.removes += 1
            elif t == "AllBlocksCleared":
                self.have.clear()
                self.clears += 1
            else:
                kc.fail(f"batch {seq}: event type {t!r}")
        self.snaps[seq] = frozenset(self.have)
        self.expected = seq + 1


def main():
    pub_exe = sys.argv[1]
    if not os.path.exists(pub_exe):
        print("skip: bkv-kv-publisher not built (no libzmq)")
        sys.exit(77)
    base = f"ipc:///tmp/bkv-kvz-{os.getpid()}"
    eps = {k: f"{base}-{k}" for k in ("pub", "replay", "truth")}
    topic = b"kv@replica0"
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 100000)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    tsub = ctx.socket(zmq.SUB)
    tsub.setsockopt(zmq.RCVHWM, 100000)
    tsub.setsockopt(zmq.SUBSCRIBE, b"truth")
    replay = ctx.socket(zmq.DEALER)
    proc = subprocess.Popen([pub_exe, "--pub", eps["pub"], "--replay", eps["replay"],
                             "--truth", eps["truth"], "--topic", topic.decode(), "--dp-rank", "0",
                             "--gap", "--step-us", "3000", "--linger-ms", "20000"])
    time.sleep(0.05)  # the publisher binds; what it sends before we connect is lost
    sub.connect(eps["pub"])
    tsub.connect(eps["truth"])
    replay.connect(eps["replay"])
    f = Follower("0")
    truths, compared, gaps, replayed, dropped_on_purpose = [], 0, 0, 0, set()
    final = None
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    poller.register(tsub, zmq.POLLIN)
    deadline = time.time() + 60

    def fill_gap(upto):
        nonlocal gaps, replayed
        gaps += 1
        replay.send_multipart([b"", f.expected.to_bytes(8, "big")])
        while True:
            if not replay.poll(5000):
                kc.fail("replay timed out")
            _, seqb, payload = replay.recv_multipart()
            if seqb == END_SEQ:
                break
            s = int.from_bytes(seqb, "big")
            if s == f.expected:
                f.apply(s, payload)
                replayed += 1
        if f.expected < upto:
            kc.fail(f"replay did not reach {upto} (at {f.expected})")

    try:
        while final is None or compared < final_needed:
            if time.time() > deadline:
                kc.fail("timed out")
            for sock, _ in poller.poll(200):
                if sock is sub:
                    top, seqb, payload = sub.recv_multipart()
                    if top != topic:
                        kc.fail(f"topic {top!r}")
                    s = int.from_bytes(seqb, "big")
                    if s % 17 == 5 and s not in dropped_on_purpose:
                        dropped_on_purpose.add(s)  # as if the network lost it
                        continue
                    if s < f.expected:
                        continue  # already had it from a replay
                    if s > f.expected:
                        fill_gap(s)
                    if s == f.expected:
                        f.apply(s, payload)
                else:
                    frames = tsub.recv_multipart()
                    truths.append(frames)
            rest = []
            for fr in truths:
                s = int.from_bytes(fr[1], "big", signed=True)
                if s >= f.expected:
                    # a batch we have not seen yet: ask for it, if the PUB
                    # socket is silent (the last one may have been dropped)
                    rest.append(fr)
                    continue
                blob = fr[2]
                want = {int.from_bytes(blob[i + 24:i + 32], "big") for i in range(0, len(blob), 32)}
                if want != f.snaps[s]:
                    kc.fail(f"after batch {s}: rebuilt {len(f.snaps[s])} blocks, pool holds {len(want)}")
                compared += 1
                if fr[3] == b"end":
                    final = [int.from_bytes(fr[4][i:i + 8], "big") for i in range(0, 48, 8)]
                    final_needed = compared
            truths = rest
            if truths and not sub.poll(0):
                s = max(int.from_bytes(fr[1], "big", signed=True) for fr in truths)
                if s >= f.expected and not sub.poll(100):
                    fill_gap(s + 1)
    finally:
        replay.send_multipart([b"", b"stop"])
        proc.wait(timeout=30)
    ev, swap_out, preempt, swaps, dropped, resyncs = final
    print(f"{f.expected} batches followed ({replayed} by replay over {gaps} gaps, "
          f"{len(dropped_on_purpose)} dropped on purpose), {f.stores} stored, {f.removes} removed, "
          f"{f.clears} cleared; {compared} index checks equal; pool: {ev} evictions, {swap_out} blocks "
          f"swapped out, {preempt} preemptions ({swaps} by swap), {dropped} ring events dropped, "
          f"{resyncs} resyncs")
    if not (gaps >= 2 and replayed > 0 and compared > 100 and ev > 0 and swap_out > 0
            and preempt > swaps > 0 and dropped > 0 and resyncs >= 1 and f.clears >= 2):
        kc.fail("the run did not go through gaps, replay, evictions, swap, recompute, overflow and reset")
    if proc.returncode != 0:
        kc.fail(f"publisher exited {proc.returncode}")
    print("ok")


if __name__ == "__main__":
    main()
