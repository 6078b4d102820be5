"""The scheduler through Python: examples/minimal.c's workload, the batch as
zero-copy read-only views valid during the call, exceptions in callbacks,
misuse refused with the right class, stats and metrics."""
import ctypes

import numpy as np
import pytest

import batchkv
from batchkv import FinishReason, Pool, Scheduler

PROMPT = [100, 101, 102, 103, 104]
STOP = 110


class PlusOne:
    """minimal.c's host: each row answers (last input token + 1)."""

    def __init__(self):
        self.tokens = {}
        self.finished = {}
        self.batches = 0

    def forward(self, b, next_tokens):
        self.batches += 1
        last = b.token_ids[b.qo_indptr[1:] - 1]
        next_tokens[:] = np.where(b.row_sample != 0, last + 1, 0)

    def on_token(self, req, branch, token, user):
        self.tokens.setdefault(req, []).append(token)

    def on_finish(self, req, reason, user):
        assert req not in self.finished
        self.finished[req] = (reason, user)


def minimal(host, **sched_kw):
    pool = Pool(device_blocks=64)
    s = Scheduler(pool, host, **sched_kw)
    ids = [s.submit(PROMPT, 2 + 2 * i, stop_tokens=[STOP], user="r%d" % i) for i in range(3)]
    return pool, s, ids


def test_minimal_workload_as_in_minimal_c():
    host = PlusOne()
    pool, s, ids = minimal(host)
    steps = s.run()
    assert steps > 0 and s.pending == 0
    # 2, 4 and 6 new tokens; the third reaches the stop token 110 at its 6th
    assert host.tokens == {ids[0]: [105, 106], ids[1]: [105, 106, 107, 108],
                           ids[2]: [105, 106, 107, 108, 109, 110]}
    assert host.finished == {ids[0]: (FinishReason.LENGTH, "r0"),
                             ids[1]: (FinishReason.LENGTH, "r1"),
                             ids[2]: (FinishReason.STOP, "r2")}
    st = s.stats()
    assert st.submitted == 3 and st.finished == 3 and st.decode_tokens + 3 == 12
    assert s.check() == 0
    text = s.metrics()
    assert "# TYPE bkv_step_duration_seconds histogram" in text
    assert "bkv_requests_finished_total" in text or "finished" in text
    s.close()
    pool.close()


def test_batch_views_are_zero_copy_read_only_and_borrowed():
    seen = {}

    class Host(PlusOne):
        def forward(self, b, next_tokens):
            raw = b._raw
            for name in ("token_ids", "positions", "qo_indptr", "kv_indptr", "kv_indices",
                         "slot_mapping", "row_sample", "row_req", "row_branch"):
                v = getattr(b, name)
                assert not v.flags.writeable, name
                # the view's memory is the library's array: no copy was made
                assert v.ctypes.data == ctypes.cast(getattr(raw, name), ctypes.c_void_p).value
                with pytest.raises(ValueError):
                    v[0] = 1
            assert next_tokens.flags.writeable and len(next_tokens) == b.n_rows
            assert list(b.positions[:b.qo_indptr[1]]) == list(range(b.qo_indptr[1])) or \
                b.n_decode_rows > 0
            if not seen:                 # the first call: the three prompts
                seen["users"] = b.users
                seen["kept"] = b.token_ids
                seen["copy"] = np.array(b.token_ids)
            return super().forward(b, next_tokens)

    host = Host()
    pool, s, ids = minimal(host)
    s.step()
    assert seen["users"] == ["r0", "r1", "r2"]
    assert list(seen["copy"]) == PROMPT * 3
    s.run()
    # a kept view is documented as invalid after the call: the library has
    # reused the buffer, the copy is intact
    assert list(seen["copy"]) == PROMPT * 3
    s.close()
    pool.close()


def test_exception_in_forward_rolls_back_and_is_reraised():
    class Flaky(PlusOne):
        fail = 0

        def forward(self, b, next_tokens):
            if self.fail:
                self.fail -= 1
                next_tokens[:] = 7      # written, then discarded by the rollback
                raise KeyError("kernel exploded")
            return super().forward(b, next_tokens)

    host = Flaky()
    pool, s, ids = minimal(host)
    s.step()                             # prefill: one token each
    before = {k: list(v) for k, v in host.tokens.items()}
    host.fail = 2
    for _ in range(2):
        with pytest.raises(KeyError, match="kernel exploded") as e:
            s.step()
        assert any("rolled the step back" in n for n in getattr(e.value, "__notes__", [""])) \
            or not hasattr(e.value, "add_note")
        assert host.tokens == before     # no token reached any request
        assert s.check() == 0 and pool.check() == 0
    s.run()
    assert host.tokens[ids[2]] == [105, 106, 107, 108, 109, 110]
    assert len(host.finished) == 3       # no request lost
    st = s.stats()
    assert st.failed_steps == 2 and st.finished == 3
    s.close()
    pool.close()


def test_negative_return_is_a_host_error():
    class Refuses(PlusOne):
        def forward(self, b, next_tokens):
            return -1

    pool = Pool(device_blocks=8)
    s = Scheduler(pool, Refuses())
    s.submit([1, 2], 1)
    with pytest.raises(batchkv.HostError) as e:
        s.step()
    assert e.value.status == -7
    assert s.pending == 1


def test_exception_in_on_token_is_raised_after_the_step_commits():
    class Noisy(PlusOne):
        def on_token(self, req, branch, token, user):
            super().on_token(req, branch, token, user)
            if token == 106:
                raise ValueError("listener failed")

    host = Noisy()
    pool, s, ids = minimal(host)
    s.step()
    with pytest.raises(ValueError, match="listener failed"):
        s.step()                         # the tokens of that step stand
    assert all(v[:2] == [105, 106] for v in host.tokens.values())
    s.run()
    assert len(host.finished) == 3 and host.tokens[ids[1]] == [105, 106, 107, 108]


def test_misuse_from_callbacks_is_refused():
    class Reentrant(PlusOne):
        def forward(self, b, next_tokens):
            self.sched.step()

    host = Reentrant()
    pool, s, ids = minimal(host)
    host.sched = s
    with pytest.raises(batchkv.StateError):
        s.step()

    class TouchesPool(PlusOne):
        def forward(self, b, next_tokens):
            self.pool.open()

    host = TouchesPool()
    pool, s, ids = minimal(host)
    host.pool = pool
    with pytest.raises(batchkv.StateError):
        s.step()
    with pytest.raises(batchkv.StateError):
        pool.close()                     # a scheduler still uses it
    s.close()
    pool.close()


def test_abort_and_submit_errors():
    host = PlusOne()
    pool, s, ids = minimal(host)
    s.abort(ids[1])
    with pytest.raises(batchkv.NotFoundError):
        s.abort(ids[1])
    with pytest.raises(batchkv.InvalidArgumentError):
        s.submit([], 4)
    with pytest.raises(batchkv.TooBigError):
        s.submit(list(range(64 * 16 + 1)), 1)
    s.run()
    assert host.finished[ids[1]][0] == FinishReason.ABORT
    assert s.stats().aborted == 1


def test_split_host_and_cost_model():
    class Split:
        def __init__(self):
            self.kinds = []

        def prefill(self, b, next_tokens):
            self.kinds.append(b.kind)
            next_tokens[:] = 1

        def decode(self, b, next_tokens):
            self.kinds.append(b.kind)
            next_tokens[:] = 2

    host = Split()
    pool = Pool(device_blocks=32)
    cost = batchkv.CalibratedCost(batchkv.PolyCost())
    s = Scheduler(pool, host, cost=cost, max_running=4)
    for i in range(4):
        s.submit([i, i + 1, i + 2], 3)
    s.run()
    assert set(host.kinds) == {batchkv.CallKind.PREFILL, batchkv.CallKind.DECODE}
    assert cost.observations(batchkv.CallKind.DECODE) > 0
    with pytest.raises(TypeError):
        Scheduler(pool, object())


def test_host_clock_and_kv_events_between_steps():
    class Clocked(PlusOne):
        t = 0

        def now_us(self):
            self.t += 250
            return self.t

    host = Clocked()
    pool = Pool(device_blocks=64, block_tokens=4, event_capacity=256, hash_seed=9)
    s = Scheduler(pool, host)
    prompt = list(range(200, 213))                # 3 full blocks + 1
    rid = s.submit(prompt, 3)
    info = s.step()
    assert host.t > 0 and info.measured_us > 0 and info.measured_us % 250 == 0
    s.run()
    assert host.finished[rid][0] == FinishReason.LENGTH
    stored = [e for e in pool.events() if e.kind == batchkv.EventKind.STORED]
    want = batchkv.block_hashes(prompt + host.tokens[rid][:-1], 4, hash_seed=9)
    assert [e.hash for e in stored] == list(want)

    class BadClock(PlusOne):
        def now_us(self):
            raise OSError("clock gone")

    s2 = Scheduler(Pool(device_blocks=8), BadClock())
    s2.submit([1, 2], 1)
    with pytest.raises(OSError, match="clock gone"):
        s2.step()


def test_abort_from_a_callback():
    class AbortsAtTwo(PlusOne):
        def on_token(self, req, branch, token, user):
            super().on_token(req, branch, token, user)
            if len(self.tokens[req]) == 2:
                self.sched.abort(req)   # allowed from callbacks; lands at the next step

    host = AbortsAtTwo()
    pool, s, ids = minimal(host)
    host.sched = s
    s.run()
    # request 0 ends by length at its 2nd token (the abort answers OK but it
    # keeps its reason); the others end by the abort, drained before the next
    # step computes anything, so with exactly 2 tokens
    assert host.finished[ids[0]][0] == FinishReason.LENGTH
    for r in ids[1:]:
        assert host.finished[r][0] == FinishReason.ABORT and host.tokens[r] == [105, 106]
    assert s.stats().aborted == 2


class GroupRecorder:
    """Copies each call's per-group arrays (the views die with the call)."""

    def __init__(self):
        self.calls = []

    def forward(self, b, next_tokens):
        assert len(b.groups) == b.n_groups
        call = {"n_groups": b.n_groups, "positions": np.array(b.positions),
                "qo_indptr": np.array(b.qo_indptr), "slot_mapping": np.array(b.slot_mapping),
                "layout": b.layout, "row_slot": np.array(b.row_slot), "groups": []}
        for g in b.groups:
            assert not g.slot_mapping.flags.writeable
            call["groups"].append({
                "index": g.index, "kind": g.kind, "span": g.span,
                "slot_mapping": np.array(g.slot_mapping),
                "slot_addr": g.slot_mapping.ctypes.data,
                "kv_indptr": np.array(g.kv_indptr), "kv_indices": np.array(g.kv_indices),
                "kv_first_block": np.array(g.kv_first_block),
                "tables": [np.array(g.row_table(int(x))) for x in b.row_slot]})
        call["batch_slot_addr"] = b.slot_mapping.ctypes.data
        self.calls.append(call)
        next_tokens[:] = 7


HYBRID = [batchkv.KvGroup(batchkv.GroupKind.FULL, 2, 0, 64),
          batchkv.KvGroup(batchkv.GroupKind.WINDOW, 2, 4, 64)]


def run_groups(groups, layout):
    host = GroupRecorder()
    kw = {"groups": groups} if groups else {}
    with Pool(device_blocks=32, block_tokens=4, **kw) as pool:
        with Scheduler(pool, host, batch_layout=layout) as s:
            s.submit(list(range(10)), 3)     # a 10-token prefill, then decode at 10 and 11
            s.run()
    assert len(host.calls) == 3
    return host.calls


def test_batch_groups_flat_window_rows_read_only_their_window():
    calls = run_groups(HYBRID, batchkv.BatchLayout.FLAT)
    for c, (first, n) in zip(calls, [(0, 3), (1, 2), (2, 1)]):
        assert c["n_groups"] == 2 and c["layout"] == batchkv.BatchLayout.FLAT
        g0, g1 = c["groups"]
        assert (g0["kind"], g0["span"], g1["kind"], g1["span"]) == \
            (batchkv.GroupKind.FULL, 0, batchkv.GroupKind.WINDOW, 4)
        # group 0 is the batch's own slot mapping (the same array)
        assert g0["slot_addr"] == c["batch_slot_addr"]
        assert list(g0["slot_mapping"]) == list(c["slot_mapping"])
        assert list(g0["kv_first_block"]) == [0] and len(g0["kv_indices"]) == 3
        # the window group: the row's blocks from the one holding position
        # (first token's position) - 3 on
        assert list(g1["kv_first_block"]) == [first] and len(g1["kv_indices"]) == n
        assert list(g1["kv_indptr"]) == [0, n]
        assert len(g1["slot_mapping"]) == len(c["positions"])
        assert not set(g1["slot_mapping"] // 4) & set(g0["slot_mapping"] // 4)
        for g in (g0, g1):  # every new token's slot lies in a block the row lists
            for t, pos in enumerate(c["positions"]):
                blk = g["kv_indices"][g["kv_indptr"][0] + pos // 4 - g["kv_first_block"][0]]
                assert g["slot_mapping"][t] == blk * 4 + pos % 4, (g["index"], t)


def test_batch_groups_persistent_tables_show_released_blocks():
    calls = run_groups(HYBRID, batchkv.BatchLayout.PERSISTENT)
    for c, released in zip(calls, [0, 1, 2]):
        assert c["n_groups"] == 2 and c["layout"] == batchkv.BatchLayout.PERSISTENT
        assert len(c["row_slot"]) == 1
        g0, g1 = c["groups"]
        assert len(g1["kv_indptr"]) == len(g1["kv_indices"]) == len(g1["kv_first_block"]) == 0
        t0, t1 = g0["tables"][0], g1["tables"][0]
        assert len(t0) == len(t1) == 3 and min(t0) >= 0
        # the window's table after the last step's commit released its blocks
        assert list(t1[:released]) == [-1] * released and min(t1[released:]) >= 0
        for g, table in ((g0, t0), (g1, t1)):
            for t, pos in enumerate(c["positions"]):
                assert g["slot_mapping"][t] == table[pos // 4] * 4 + pos % 4


def test_batch_of_a_pool_without_groups_has_group_0():
    for c in run_groups(None, batchkv.BatchLayout.FLAT):
        assert c["n_groups"] == 1 and len(c["groups"]) == 1
        g0 = c["groups"][0]
        assert (g0["kind"], g0["span"]) == (batchkv.GroupKind.FULL, 0)
        assert g0["slot_addr"] == c["batch_slot_addr"]
        assert len(g0["kv_indices"]) == 3 and len(g0["kv_first_block"]) == 0


class StateRecorder:
    """Copies each call's STATE group (the views die with the call)."""

    def __init__(self):
        self.calls = []

    def forward(self, b, next_tokens):
        attn, st = b.groups[0], b.groups[-1]
        assert attn.state_in is None and attn.state_out is None and attn.state_frames == 0
        assert not st.state_in.flags.writeable and not st.state_out.flags.writeable
        self.calls.append({"n_decode_rows": b.n_decode_rows, "positions": np.array(b.positions),
                           "kind": st.kind, "span": st.span, "frames": st.state_frames,
                           "in": np.array(st.state_in), "out": np.array(st.state_out)})
        next_tokens[:] = 7


def test_batch_state_group_hands_each_row_its_state_units():
    groups = [batchkv.KvGroup(batchkv.GroupKind.FULL, 1, 0, 64),
              batchkv.KvGroup(batchkv.GroupKind.STATE, 1, 8, 256)]
    frames = batchkv.kv_state_frames(groups, 4)
    attention = 64 - 8 * frames
    host = StateRecorder()
    with Pool(device_blocks=64, block_tokens=4, state_units=8, groups=groups) as pool:
        with Scheduler(pool, host) as s:
            s.submit(list(range(10)), 3)      # a 10-token prefill, then decode at 10 and 11
            s.run()
    # the prefill is cut at the checkpoint at 8: positions 0..7, 8..9, then 10, 11
    assert [list(c["positions"]) for c in host.calls] == [list(range(8)), [8, 9], [10], [11]]
    first = host.calls[0]
    assert (first["kind"], first["span"]) == (batchkv.GroupKind.STATE, 8)
    assert first["n_decode_rows"] == 0 and first["in"][0] == -1   # the zero state
    for prev, c in zip([None] + host.calls, host.calls):
        assert c["kind"] == batchkv.GroupKind.STATE and c["frames"] == frames >= 1
        assert len(c["in"]) == len(c["out"]) == 1
        assert attention <= c["out"][0] < 64 and c["out"][0] != c["in"][0]
        if prev is not None:                  # each call reads the state the last one wrote
            assert c["in"][0] == prev["out"][0]


class NoTokenCallback(PlusOne):
    """PlusOne without on_token: the tokens come from outputs()."""
    on_token = None


def test_step_outputs_as_arrays_repeat_the_callbacks():
    host = PlusOne()
    pool, s, ids = minimal(host, outputs=True)
    seen, ended = {}, {}
    while s.pending:
        s.step()
        o = s.outputs()
        assert o.token_ids.dtype == np.int32 and o.token_req.dtype == np.uint64
        for r, b, t in zip(o.token_req, o.token_branch, o.token_ids):
            assert b == 0
            seen.setdefault(int(r), []).append(int(t))
        for r, why in zip(o.finished_req, o.finished_reason):
            ended[int(r)] = FinishReason(int(why))
    assert seen == host.tokens
    assert ended == {r: host.finished[r][0] for r in host.finished}
    with pytest.raises(ValueError):
        o.token_ids[:1] = 0  # read-only views


def test_step_outputs_serve_a_host_without_on_token():
    host = NoTokenCallback()
    pool, s, ids = minimal(host)
    with pytest.raises(batchkv.StateError):
        s.outputs()  # not enabled
    s.enable_outputs()
    tokens = {}
    while s.pending:
        s.step()
        o = s.outputs()
        for r, t in zip(o.token_req.tolist(), o.token_ids.tolist()):
            tokens.setdefault(r, []).append(t)
    assert tokens == {ids[0]: [105, 106], ids[1]: [105, 106, 107, 108],
                      ids[2]: [105, 106, 107, 108, 109, 110]}


def test_wait_returns_when_another_thread_submits_and_wake_ends_it():
    import threading
    host = NoTokenCallback()
    pool = Pool(device_blocks=64)
    s = Scheduler(pool, host)
    assert s.wait(0) is False
    t = threading.Timer(0.02, lambda: s.submit(PROMPT, 2))
    t.start()
    assert s.wait() is True
    t.join()
    s.run()
    w = threading.Timer(0.02, s.wake)
    w.start()
    assert s.wait() is False
    w.join()


class PlusOneSpec(PlusOne):
    """PlusOne that verifies drafts: after every token it samples token + 1,
    so it writes spec_tokens[j] = token_ids[j] + 1 for a drafted row and
    lets the library accept greedily (n_accepted left at -1)."""

    def __init__(self):
        super().__init__()
        self.drafted_rows = 0

    def forward(self, b, next_tokens):
        PlusOne.forward(self, b, next_tokens)
        if b.n_spec_rows:
            self.drafted_rows += int(b.n_spec_rows)
            n = len(b.spec_tokens)
            b.spec_tokens[:] = b.token_ids[:n] + 1
            assert (b.n_accepted == -1).all()


class PlusOneHostDrafts(PlusOneSpec):
    """Drafts from the host: the next three tokens of the +1 sequence."""

    def draft(self, req, branch, context, k, user):
        assert not context.flags.writeable
        return [int(context[-1]) + 1 + j for j in range(min(k, 3))]


def test_speculative_decoding_with_library_and_host_drafts_matches_plain():
    plain = PlusOne()
    minimal(plain)[1].run()
    for host, kw in ((PlusOneSpec(), {}), (PlusOneHostDrafts(), {"spec_drafts": 1})):
        pool, s, ids = minimal(host, spec_max_k=4, spec_k_mode=1, **kw)
        # a cyclic history so that the n-gram lookup finds matches
        s.run()
        assert host.tokens == plain.tokens
        assert {r: f[0] for r, f in host.finished.items()} == \
            {r: f[0] for r, f in plain.finished.items()}
        st = s.stats()
        if kw:  # host drafts always match: every step of a row accepts
            assert host.drafted_rows > 0 and st.spec_accepted > 0


def test_submit_with_retention_ranges():
    host = PlusOne()
    pool = Pool(device_blocks=64, block_tokens=4)
    s = Scheduler(pool, host, retention=1)
    prompt = list(range(200, 216))
    rid = s.submit(prompt, 2, retention=[(0, 8, 90, 0), (8, 16, 10, 1000)])
    s.run()
    assert host.finished[rid][0] == FinishReason.LENGTH
    with pytest.raises(batchkv.InvalidArgumentError) as e:
        s.submit(prompt, 2, retention=[(8, 4, 1, 0)])  # start after end
    assert "retention" in str(e.value)
    s2 = Scheduler(Pool(device_blocks=64, block_tokens=4), PlusOne())
    with pytest.raises(batchkv.InvalidArgumentError):
        s2.submit(prompt, 2, retention=[(0, 8, 90, 0)])  # retention off


class MirrorTables(PlusOne):
    """A persistent-layout host: keeps its own copy of every row slot's
    table from the deltas and checks it against the library's tables."""

    def __init__(self):
        super().__init__()
        self.tables = {}
        self.deltas = 0

    def forward(self, b, next_tokens):
        assert b.layout == batchkv.BatchLayout.PERSISTENT
        blocks, at = b.delta_blocks, 0
        for slot, start, n, length, _flags in b.table_deltas.tolist():
            t = self.tables.setdefault(slot, [])
            t.extend([0] * max(0, start + n - len(t)))
            t[start:start + n] = blocks[at:at + n].tolist()
            del t[length:]
            at += n
            self.deltas += 1
        assert at == len(blocks)
        for slot in b.row_slot.tolist():
            assert self.tables[slot] == b.groups[0].row_table(slot).tolist()
        PlusOne.forward(self, b, next_tokens)


def test_persistent_layout_deltas_rebuild_the_libraries_tables():
    host = MirrorTables()
    pool = Pool(device_blocks=64, block_tokens=4)
    s = Scheduler(pool, host, batch_layout=batchkv.BatchLayout.PERSISTENT)
    for i in range(4):
        s.submit(list(range(100 + i, 110 + i)), 9)
    s.run()
    assert host.deltas > 0 and len(host.finished) == 4


class OverlappedPlusOne(PlusOne):
    """An overlapped host: launch() queues the batch's answers (the input
    tokens, placeholders included, are resolved when the device runs it) and
    the test's loop runs the device between launch and complete."""

    def __init__(self):
        super().__init__()
        self.queue = []
        self.last = {}  # (req, branch) -> the last token the device produced

    def launch(self, b, next_tokens):
        rows = []
        for r in range(b.n_rows):
            if b.row_sample[r]:
                t = int(b.token_ids[b.qo_indptr[r + 1] - 1])
                rows.append((r, int(b.row_req[r]), int(b.row_branch[r]), t))
        self.queue.append((rows, next_tokens))

    def run_device(self):
        rows, next_tokens = self.queue.pop(0)
        for r, req, br, t in rows:
            if t < -1:  # a placeholder: the token the step before produced
                t = self.last[(req, br)]
            next_tokens[r] = t + 1
            self.last[(req, br)] = t + 1


def test_overlapped_scheduling_launch_complete_matches_plain():
    plain = PlusOne()
    minimal(plain)[1].run()
    host = OverlappedPlusOne()
    pool, s, ids = minimal(host, overlap=1)
    outstanding = []
    while s.pending or outstanding:
        t = s.launch() if s.pending else 0
        if t is None or t == 0:
            while outstanding:
                host.run_device()
                s.complete(outstanding.pop(0))
            continue
        outstanding.append(t)
        if len(outstanding) == 2:
            host.run_device()
            s.complete(outstanding.pop(0))
    assert host.tokens == plain.tokens
    assert s.stats().overlap_steps > 0


class PipelinedPlusOne(PlusOne):
    """An overlapped host at any depth: launch() copies what the device reads
    (token ids, rows, which rows sample) and returns; the device runs the
    steps in launch order, resolves each placeholder from the tokens of the
    steps it ran before (batchkv.resolve_placeholders: by back distance and
    row) and answers last input token + 1, as PlusOne does."""

    def __init__(self):
        super().__init__()
        self.queue = []
        self.recent = []  # sampled tokens of the steps run, newest first
        self.backs = {}  # back distance -> placeholders seen

    def launch(self, b, next_tokens):
        ids = np.array(b.token_ids, dtype=np.int32)
        for k in batchkv.token_pending_back(ids[batchkv.token_is_pending(ids)]).tolist():
            self.backs[k] = self.backs.get(k, 0) + 1
        self.queue.append((ids, np.array(b.qo_indptr), np.array(b.row_sample), next_tokens))

    def run_device(self):
        ids, qo, sample, next_tokens = self.queue.pop(0)
        ids = batchkv.resolve_placeholders(ids, self.recent)
        out = np.where(sample != 0, ids[qo[1:] - 1] + 1, 0).astype(np.int32)
        next_tokens[:] = out
        self.recent.insert(0, out)
        del self.recent[batchkv.OVERLAP_MAX_DEPTH:]


def serve_pipelined(depth):
    """Twelve requests (one forked) served at overlap depth `depth` by the
    drain rules: launch until depth steps are in flight, complete the oldest
    once depth + 1 are outstanding or a launch had nothing to compute, and
    every outstanding step after BKV_EAGAIN. Returns the host, the request
    ids and the most steps outstanding."""
    host = PipelinedPlusOne()
    pool = Pool(device_blocks=256)
    s = Scheduler(pool, host, overlap=depth)
    ids = [s.submit([100 + 7 * i + j for j in range(5 + i)], 4 + 3 * i, n=2 if i == 5 else 1)
           for i in range(12)]
    outstanding, most = [], 0
    while s.pending or outstanding:
        t = s.launch() if s.pending else 0
        if t is None:
            while outstanding:
                host.run_device()
                s.complete(outstanding.pop(0))
            continue
        if t:
            outstanding.append(t)
            most = max(most, len(outstanding))
        if len(outstanding) == depth + 1 or (t == 0 and outstanding):
            host.run_device()
            s.complete(outstanding.pop(0))
    assert s.stats().overlap_steps > 0
    return host, ids, most


def test_placeholder_helpers_match_the_header_encoding():
    assert batchkv.token_pending_at(1, 0) == -2
    assert batchkv.token_pending_at(1, 5) == -7
    assert batchkv.token_pending_at(2, 0) == -2 - (1 << 18)
    for back in (1, 2, batchkv.OVERLAP_MAX_DEPTH):
        for row in (0, 1, (1 << 18) - 1):
            t = batchkv.token_pending_at(back, row)
            assert batchkv.token_is_pending(t)
            assert (batchkv.token_pending_back(t), batchkv.token_pending_row(t)) == (back, row)
    assert not batchkv.token_is_pending(batchkv.TOKEN_FAIL)
    assert not batchkv.token_is_pending(batchkv.token_pending_at(batchkv.OVERLAP_MAX_DEPTH + 1, 0))
    ids = [5, batchkv.token_pending_at(1, 1), batchkv.token_pending_at(2, 0), 9]
    assert batchkv.resolve_placeholders(ids, [[10, 11], [20]]).tolist() == [5, 11, 20, 9]
    with pytest.raises(IndexError):
        batchkv.resolve_placeholders(ids, [[10, 11]])


@pytest.mark.parametrize("depth", [2, 4])
def test_pipelined_depth_keeps_depth_steps_in_flight_and_matches_plain(depth):
    plain, ids1, most1 = serve_pipelined(1)
    host, ids, most = serve_pipelined(depth)
    assert (most1, most) == (2, depth + 1)
    # a forked request's two branches interleave differently; each token is
    # the one before + 1 either way
    assert [sorted(host.tokens[i]) for i in ids] == [sorted(plain.tokens[i]) for i in ids1]
    assert host.tokens[ids[0]] == [105, 106, 107, 108]
    assert sum(host.backs.values()) > 0
    assert set(host.backs) <= set(range(1, depth + 1))


def test_release_and_resume_the_device_kv():
    host = PlusOne()
    pool, s, ids = minimal(host)
    s.step()
    with pytest.raises(batchkv.StateError) as e:
        s.release_kv()  # BKV_RELEASE_REFUSE with requests running
    assert "running" in str(e.value)
    s.release_kv(batchkv._ffi.BKV_RELEASE_RECOMPUTE)
    batches = host.batches
    s.step()  # released: drains only
    assert host.batches == batches and s.pending == 3
    s.resume_kv()
    s.run()
    assert host.tokens[ids[2]] == [105, 106, 107, 108, 109, 110]
