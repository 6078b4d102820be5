"""A KV connector (Scheduler(connector=...), xfer_done) over an in-memory
store that moves the tiny numpy transformer's K/V (tinylm_np.PagedHost):
what one engine saves, a second engine on a fresh pool loads instead of
computing, token for token equal to a run without the connector and to each
request run alone. Transfers complete inside the call or later, from the
stepping thread or another one; lookups answered later, failed blocks,
failed saves, exceptions in the connector and refused completions. A pool
with a full and a window group, whose connector's contains() ends each load
where both groups' blocks are held."""
import ctypes
import threading

import numpy as np
import pytest

import batchkv
from batchkv import (CONNECTOR_LATER, XFER_BLOCK_DTYPE, InvalidArgumentError, NotFoundError,
                     Scheduler)
from tinylm_np import Job, PagedHost, TinyLM, workload

BT = 4


@pytest.fixture(scope="module")
def model():
    return TinyLM()


@pytest.fixture(scope="module")
def jobs_ref(model):
    return workload(model, n_jobs=12, block_tokens=BT, fork_every=5)


def clone(jobs):
    out = []
    for j in jobs:
        c = Job(j.prompt, j.max_new, j.stop, j.n, j.seed)
        c.ref = j.ref
        out.append(c)
    return out


class Store:
    """The external store: block hash -> (K, V) of the block's slots."""

    def __init__(self):
        self.blocks = {}


class Connector:
    """The store as a connector of one engine (its host's device K/V).
    inline: complete each transfer inside the call; else queue it for
    flush(). later: answer each request's first lookup CONNECTOR_LATER.
    fail_index: fail the load of every block of that logical index."""

    def __init__(self, store, host, inline=True, later=False, fail_index=None,
                 save_status=0):
        self.store, self.host = store, host
        self.inline, self.later, self.fail_index = inline, later, fail_index
        self.save_status = save_status
        self.sched = None       # set once the scheduler exists
        self.queue = []         # (xfer, blocks, is_load) not yet completed
        self.asked = set()
        self.lookups = self.loads = self.saves = self.load_blocks = 0
        self.max_saves = 8
        self.save_blocks = 4

    def lookup(self, req, hashes):
        assert hashes.dtype == np.uint64
        self.lookups += 1
        if self.later and req not in self.asked:
            self.asked.add(req)
            return CONNECTOR_LATER
        n = 0
        while n < len(hashes) and int(hashes[n]) in self.store.blocks:
            n += 1
        return n

    def _start(self, xfer, blocks, is_load):
        assert blocks.dtype == XFER_BLOCK_DTYPE and not blocks.flags.writeable
        if self.inline:
            self.run(xfer, blocks, is_load)
        else:
            self.queue.append((xfer, blocks, is_load))

    def load(self, xfer, req, blocks):
        self.loads += 1
        self.load_blocks += len(blocks)
        self._start(xfer, blocks, True)

    def save(self, xfer, blocks):
        self.saves += 1
        self._start(xfer, blocks, False)

    def run(self, xfer, blocks, is_load):
        """Move the K/V and complete the transfer."""
        h, bt, failed = self.host, BT, []
        for i, b in enumerate(blocks):
            assert b["frames"] == 1 and b["group"] == 0
            d = slice(int(b["block"]) * bt, (int(b["block"]) + 1) * bt)
            if is_load:
                kv = self.store.blocks.get(int(b["hash"]))
                if kv is None or int(b["index"]) == self.fail_index:
                    failed.append(i)
                    continue
                h.dk[d], h.dv[d] = kv
            elif self.save_status == 0:
                self.store.blocks[int(b["hash"])] = (h.dk[d].copy(), h.dv[d].copy())
        self.sched.xfer_done(xfer, 0 if is_load else self.save_status, failed)

    def flush(self):
        while self.queue:
            self.run(*self.queue.pop())


def serve(model, jobs, connector=None, flush_every=3, **conn_kw):
    host = PagedHost(model, BT, 256)
    pool = batchkv.Pool(block_tokens=BT, device_blocks=256, event_capacity=4096)
    conn = None
    kw = {}
    if connector is not None:
        conn = Connector(connector, host, **conn_kw)
        kw["connector"] = conn
    s = Scheduler(pool, host, max_running=16, chunked_prefill=1, token_budget=64, **kw)
    if conn is not None:
        conn.sched = s
    for j in jobs:
        j.req = s.submit(j.prompt, j.max_new, stop_tokens=j.stop, n=j.n, user=j)
    steps = 0
    while s.pending or (conn is not None and conn.queue):
        s.step()
        assert s.check() == 0
        steps += 1
        if conn is not None and steps % flush_every == 0:
            conn.flush()
        assert steps < 5000, "stuck"
    if conn is not None:
        conn.flush()
        s.step()
    st, events = s.stats(), pool.events(4096)
    s.close()
    pool.close()
    for j in jobs:
        assert j.finished == 1
    return st, events, conn


def tokens(jobs):
    return [j.got for j in jobs]


@pytest.mark.parametrize("inline", [True, False])
def test_a_second_engine_loads_what_the_first_saved(model, jobs_ref, inline):
    plain = clone(jobs_ref)
    serve(model, plain)
    assert tokens(plain) == [j.ref for j in plain]

    store = Store()
    first = clone(jobs_ref)
    s1, ev1, c1 = serve(model, first, store, inline=inline)
    assert s1.kv_saved > 0 and s1.kv_save_held == 0 and s1.kv_save_failed == 0
    assert c1.saves > 0 and 0 < len(store.blocks) <= s1.kv_saved
    ext = [e for e in ev1 if e.medium == batchkv._ffi.BKV_MEDIUM_EXTERNAL]
    assert len(ext) == s1.kv_saved and all(e.kind == batchkv.EventKind.STORED for e in ext)
    assert tokens(first) == tokens(plain)

    second = clone(jobs_ref)
    s2, _, c2 = serve(model, second, store, inline=inline)
    assert s2.kv_lookups >= len(jobs_ref) and s2.kv_lookup_errors == 0
    assert s2.kv_loads > 0 and c2.loads == s2.kv_loads
    assert s2.kv_load_tokens > 0 and s2.kv_load_failed == 0
    assert s2.kv_waiting == 0
    assert tokens(second) == tokens(plain), "a loaded prefix changed the tokens"


def test_lookups_answered_later_and_a_failed_block(model, jobs_ref):
    store = Store()
    plain = clone(jobs_ref)
    serve(model, plain, store)
    later = clone(jobs_ref)
    st, _, conn = serve(model, later, store, later=True)
    assert st.kv_lookups >= 2 * len(jobs_ref) and conn.asked
    assert st.kv_load_tokens > 0
    assert tokens(later) == tokens(plain)
    failing = clone(jobs_ref)
    st, _, conn = serve(model, failing, store, fail_index=1)
    assert st.kv_load_failed > 0 and st.kv_loads > 0
    assert tokens(failing) == tokens(plain), "a failed block was not recomputed"


class PlusOne:
    def forward(self, b, next_tokens):
        last = b.token_ids[b.qo_indptr[1:] - 1]
        next_tokens[:] = np.where(b.row_sample != 0, last + 1, 0)


class Queued:
    """A connector that queues every transfer; fails lookups on demand."""

    def __init__(self, fail_lookup=False):
        self.queue, self.fail_lookup, self.preempts = [], fail_lookup, []

    def lookup(self, req, hashes):
        if self.fail_lookup:
            self.fail_lookup = False
            raise KeyError("store offline")
        return 0

    def load(self, xfer, req, blocks):
        self.queue.append((xfer, len(blocks)))

    def save(self, xfer, blocks):
        self.queue.append((xfer, len(blocks)))

    def preempted(self, req):
        self.preempts.append(req)


def test_xfer_done_refusals_change_nothing():
    pool = batchkv.Pool(block_tokens=4, device_blocks=64)
    conn = Queued()
    s = Scheduler(pool, PlusOne(), connector=conn)
    s.submit(list(range(100, 120)), 3)
    while not conn.queue:
        s.step()
    xfer, n = conn.queue[0]
    with pytest.raises(NotFoundError):
        s.xfer_done(xfer ^ (1 << 40))
    with pytest.raises(InvalidArgumentError):
        s.xfer_done(xfer, 0, [n + 100])
    s.run()
    assert s.stats().kv_save_held > 0, "the saves hold their blocks"
    # complete every save from another thread, the first one failed
    t = threading.Thread(target=lambda: [s.xfer_done(x, -1 if i == 0 else 0)
                                         for i, (x, _) in enumerate(conn.queue)])
    t.start()
    t.join()
    s.step()
    st = s.stats()
    assert st.kv_save_held == 0 and st.kv_save_failed == conn.queue[0][1]
    assert st.kv_saved == sum(k for _, k in conn.queue[1:])
    with pytest.raises(NotFoundError):
        s.xfer_done(xfer)  # done once
    s.close()
    with pytest.raises(batchkv.StateError):
        s.xfer_done(xfer)
    pool.close()


def test_connector_exceptions_and_refused_configs():
    pool = batchkv.Pool(block_tokens=4, device_blocks=64)
    conn = Queued(fail_lookup=True)
    s = Scheduler(pool, PlusOne(), connector=conn)
    s.submit(list(range(100, 120)), 3)
    with pytest.raises(KeyError, match="store offline"):
        s.step()
    for x, _ in conn.queue:
        s.xfer_done(x)
    conn.queue.clear()
    s.run()
    st = s.stats()
    assert st.kv_lookup_errors == 1 and st.finished == 1
    s.close()
    with pytest.raises(TypeError):
        Scheduler(pool, PlusOne(), connector=object())
    pool.close()
    # the defaults: padding zero, no connector
    cfg = batchkv._ffi.bkv_sched_config()
    batchkv._lib.bkv_sched_config_init(ctypes.byref(cfg))
    assert cfg.pad1 == 0 and not cfg.connector
    nocache = batchkv.Pool(block_tokens=4, device_blocks=64, prefix_cache=0)
    with pytest.raises(InvalidArgumentError):
        Scheduler(nocache, PlusOne(), connector=Queued())
    nocache.close()


# -- a hybrid pool (a full group and a window group) and contains() ----------

HYBRID = [batchkv.KvGroup(batchkv.GroupKind.FULL, 2, 0, 64),
          batchkv.KvGroup(batchkv.GroupKind.WINDOW, 2, 6, 64)]
M64 = (1 << 64) - 1


def mix(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


class GroupCells:
    """A host with a KV cell per slot of each group, whose next token
    depends on every cell it reads through the groups' block tables (the
    full group: the whole sequence; the window group: its last span
    positions), so a wrong or missing block of either group changes the
    tokens or trips the read of an empty cell."""

    def __init__(self, blocks):
        self.dev = [[0] * (blocks * BT) for _ in HYBRID]
        self.tokens = {}
        self.finished = 0

    def forward(self, b, next_tokens):
        tok, pos, qo, groups = b.token_ids, b.positions, b.qo_indptr, b.groups
        assert len(groups) == len(HYBRID)
        for r in range(len(qo) - 1):
            h = 0
            for i in range(int(qo[r]), int(qo[r + 1])):
                p = int(pos[i])
                for gi, g in enumerate(groups):
                    self.dev[gi][int(g.slot_mapping[i])] = mix((gi << 56) | (int(tok[i]) << 32) | p)
                h = 0
                for gi, g in enumerate(groups):
                    lo = max(0, p - int(g.span) + 1) if g.span else 0
                    base, first = int(g.kv_indptr[r]), int(g.kv_first_block[r])
                    for q in range(lo, p + 1):
                        cell = self.dev[gi][int(g.kv_indices[base + q // BT - first]) * BT + q % BT]
                        assert cell != 0, "group %d position %d read before it was written" % (gi, q)
                        h = mix(h ^ cell)
            if b.row_sample[r]:
                next_tokens[r] = 100 + h % 900

    def on_token(self, req, branch, token, user):
        self.tokens.setdefault(user, []).append(token)

    def on_finish(self, req, reason, user):
        self.finished += 1


class GroupStore:
    """A connector over held (hash -> (group, index, cells)) for a
    GroupCells host, with contains(); transfers complete inside the call.
    raise_contains: the first contains() raises."""

    def __init__(self, host, held, raise_contains=False):
        self.host, self.held, self.raise_contains = host, held, raise_contains
        self.sched = None
        self.contains_calls = self.loads = self.saves = 0
        self.loaded_groups = set()

    def lookup(self, req, hashes):
        n = 0
        while n < len(hashes) and int(hashes[n]) in self.held:
            n += 1
        return n

    def contains(self, h):
        assert isinstance(h, int)
        self.contains_calls += 1
        if self.raise_contains:
            self.raise_contains = False
            raise LookupError("contains failed")
        return h in self.held

    def load(self, xfer, req, blocks):
        self.loads += 1
        self.run(xfer, blocks, True)

    def save(self, xfer, blocks):
        self.saves += 1
        self.run(xfer, blocks, False)

    def run(self, xfer, blocks, is_load):
        failed = []
        for i, b in enumerate(blocks):
            assert b["frames"] == 1
            g, lo = int(b["group"]), int(b["block"]) * BT
            if is_load:
                got = self.held.get(int(b["hash"]))
                if got is None:
                    failed.append(i)
                    continue
                assert got[:2] == (g, int(b["index"])), "a hash names one group's block"
                self.host.dev[g][lo:lo + BT] = got[2]
                self.loaded_groups.add(g)
            else:
                self.held[int(b["hash"])] = (g, int(b["index"]), self.host.dev[g][lo:lo + BT])
        self.sched.xfer_done(xfer, 0, failed)


def hybrid_prompts():
    """8 prompts: 6 shared blocks and a private tail of 1..5 tokens."""
    return [list(range(500, 500 + 6 * BT)) + [700 + 10 * i + t for t in range(1 + i % 5)]
            for i in range(8)]


class NoContains(GroupStore):
    """The same store without contains() (bkv_connector.contains NULL)."""
    contains = None


def serve_hybrid(held=None, raise_contains=False, store=GroupStore):
    host = GroupCells(256)
    pool = batchkv.Pool(block_tokens=BT, device_blocks=256, groups=HYBRID)
    conn = None if held is None else store(host, held, raise_contains)
    kw = {} if conn is None else {"connector": conn}
    s = Scheduler(pool, host, max_running=8, chunked_prefill=1, token_budget=24, **kw)
    if conn is not None:
        conn.sched = s
    ps = hybrid_prompts()
    for i, p in enumerate(ps):
        s.submit(p, 5, user=i)
    raised = 0
    steps = 0
    while s.pending:
        try:
            s.step()
        except LookupError:
            raised += 1
        assert s.check() == 0
        steps += 1
        assert steps < 2000, "stuck"
    s.step()
    st = s.stats()
    s.close()
    pool.close()
    assert host.finished == len(ps)
    return [host.tokens[i] for i in range(len(ps))], st, conn, raised


def test_a_hybrid_pool_loads_every_groups_blocks_with_contains():
    plain, _, _, _ = serve_hybrid()
    held = {}
    t1, s1, c1, _ = serve_hybrid(held)
    assert t1 == plain
    assert s1.kv_saved > 0 and c1.saves > 0 and s1.kv_save_failed == 0
    assert {v[0] for v in held.values()} == {0, 1}, "both groups' blocks were saved"
    # the store loses the window group's block of the last shared block: the
    # prefix lookup() reports (group 0's 6 blocks) lacks a window block
    # (each engine below gets its own copy: what it recomputes it saves)
    kept = {h: v for h, v in held.items() if v[:2] != (1, 5)}
    assert len(kept) < len(held)

    t2, s2, c2, _ = serve_hybrid(dict(kept))
    assert c2.contains_calls > 0, "the library asked contains()"
    assert s2.kv_loads > 0 and s2.kv_load_tokens > 0, \
        "the second engine loads (%d failed, %d lookups)" % (s2.kv_load_failed, s2.kv_lookups)
    assert s2.kv_load_failed == 0, "the load ended where every group's blocks are held"
    assert c2.loaded_groups == {0, 1}
    assert s2.kv_load_tokens == s2.kv_loads * 5 * BT, "each load ends before the lost block"
    assert t2 == plain, "a loaded prefix changed the tokens"

    # without contains() the load ends where lookup() said: the lost window
    # block fails (and is recomputed)
    t3, s3, c3, _ = serve_hybrid(dict(kept), store=NoContains)
    assert c3.contains_calls == 0 and s3.kv_load_failed > 0
    assert t3 == plain

    # an exception in contains(): that block counts as not held, and step()
    # re-raises it after the step
    t4, s4, c4, raised = serve_hybrid(dict(kept), raise_contains=True)
    assert raised == 1 and c4.contains_calls > 1
    assert s4.kv_load_failed == 0
    assert t4 == plain
