"""The pool through Python: errors by class, sequences, prefix hits, fork and
copy-on-write, swap, KV events, export/import, sizing helpers."""
import ctypes

import numpy as np
import pytest

import batchkv
from batchkv import CopyKind, EventKind, Pool


def test_version_and_strerror():
    assert batchkv.version() == batchkv.__version__ == "0.1.0"
    assert batchkv.strerror(-7) == "a host callback failed"
    assert batchkv.strerror(12345) == "unknown error"


def test_one_class_per_status_code():
    codes = {c: cls for c, cls in batchkv.ERRORS.items()}
    assert sorted(codes) == [-8, -7, -6, -5, -4, -3, -2, -1]
    assert len(set(codes.values())) == 8
    for c, cls in codes.items():
        assert issubclass(cls, batchkv.BkvError) and cls.status == c
    assert issubclass(batchkv.NotFoundError, LookupError)
    assert issubclass(batchkv.OutOfMemoryError, MemoryError)
    assert issubclass(batchkv.InvalidArgumentError, ValueError)


def test_errors_come_from_real_calls():
    with pytest.raises(batchkv.InvalidArgumentError) as e:
        Pool(device_blocks=0)
    assert e.value.status == -1 and "invalid argument" in str(e.value)
    with pytest.raises(TypeError):
        Pool(device_blocks=8, no_such_field=1)
    with Pool(device_blocks=4, block_tokens=4, max_seqs=2) as p:
        s = p.open()
        with pytest.raises(batchkv.NotFoundError):
            p.close_seq(s + 12345)
        with pytest.raises(batchkv.StateError):      # no host tier
            p.swap_out(s)
        with pytest.raises(batchkv.TooBigError):     # 5 blocks > the pool's 4
            p.append(s, range(17))
        p.append(s, range(12))                       # 3 of the 4 blocks
        t = p.open()
        with pytest.raises(batchkv.NoSpaceError):    # 2 more blocks, 1 free
            p.append(t, range(50, 58))
        assert p.info(t).len == 0 and p.info(s).len == 12  # all-or-nothing
    # a sequence longer than the whole pool
    with Pool(device_blocks=2, block_tokens=4) as p:
        s = p.open()
        p.append(s, [1] * 8)
        with pytest.raises(batchkv.TooBigError):
            p.append(s, [1])
    with Pool(device_blocks=4, max_seqs=1) as p:
        p.open()
        with pytest.raises(batchkv.TryAgainError):
            p.open()


def test_prefix_hits_fork_and_copy_on_write():
    with Pool(device_blocks=16, block_tokens=4) as p:
        a = p.open()
        assert p.append(a, range(10)) == 0
        assert p.info(a) == batchkv.SeqInfo(10, 3, False, 0)
        b = p.open()
        assert p.append(b, range(9)) == 8            # two full blocks hit
        assert list(p.blocks(b)[:2]) == list(p.blocks(a)[:2])
        c = p.fork(a)
        assert list(p.blocks(c)) == list(p.blocks(a))
        p.append(c, [99])                            # write into the shared partial block
        cp = p.copies(CopyKind.DEVICE)
        assert cp.shape == (1, 2) and cp[0, 0] == p.blocks(a)[2] and cp[0, 1] == p.blocks(c)[2]
        p.clear_copies(CopyKind.DEVICE)
        assert p.copies(CopyKind.DEVICE).shape == (0, 2)
        st = p.stats()
        assert st.hit_tokens == 8 and st.cow_copies == 1 and st.nr_seqs == 3
        assert st.nr_free + st.nr_used + st.nr_cached == 16
        assert p.blocks_needed(a, 10) == 2           # 2 fill its last block, 8 take 2
        p.truncate(a, 4)
        assert p.info(a).len == 4
        for s in (a, b, c):
            p.close_seq(s)
        assert p.check() == 0
        assert p.available() == 16 and p.can_admit(64) and not p.can_admit(65)


def test_memory_and_block_inspection():
    with Pool(device_blocks=16, block_tokens=4, hash_seed=3) as p:
        m = p.memory()
        # the index: 8 B per slot plus the LRU's release-order chunks (the
        # exact figure is pinned by tests/test_inspect.c)
        assert m.index_slots == 32 and m.index > 32 * 8 and m.index_used == 0
        # the token store, 4 B per slot, plus up to 64 B of alignment
        assert 16 * 4 * 4 <= m.device_tokens <= 16 * 4 * 4 + 64
        assert m.blocks == 16 * m.block_bytes
        assert m.total > m.blocks + m.device_tokens + m.index
        a = p.open(key=7)
        p.append(a, range(10))
        t = p.blocks(a)
        b1 = p.block(t[1])
        assert b1.state == batchkv.BlockState.PINNED and b1.ref_count == 1 and b1.indexed
        assert b1.parent == t[0] and b1.fill == 4 and b1.key == 7
        assert list(b1.tokens) == [4, 5, 6, 7]
        assert b1.hash == batchkv.block_hashes(range(8), 4, hash_seed=3, key=7)[1]
        b2 = p.block(t[2])
        assert b2.fill == 2 and not b2.indexed and b2.hash == 0 and list(b2.tokens) == [8, 9]
        assert p.memory().index_used == 2
        p.close_seq(a)
        assert p.block(t[0]).state == batchkv.BlockState.CACHED
        assert p.block(t[2]).state == batchkv.BlockState.FREE and len(p.block(t[2]).tokens) == 0
        for bad in (-1, 16):
            with pytest.raises(batchkv.InvalidArgumentError):
                p.block(bad)


def test_swap_out_and_in_list_the_copies():
    with Pool(device_blocks=8, block_tokens=4, host_blocks=8, prefix_cache=False) as p:
        s = p.open()
        p.append(s, range(6))
        dev = p.blocks(s)
        p.swap_out(s)
        out = p.copies(CopyKind.SWAP_OUT)
        assert list(out[:, 0]) == list(dev) and p.info(s).swapped
        with pytest.raises(batchkv.StateError):
            p.append(s, [1])
        p.clear_copies(CopyKind.SWAP_OUT)
        p.swap_in(s)
        inn = p.copies(CopyKind.SWAP_IN)
        assert list(inn[:, 0]) == list(out[:, 1]) and list(inn[:, 1]) == list(p.blocks(s))
        p.clear_copies(CopyKind.SWAP_IN)
        assert p.stats().swap_in_blocks == 2 and p.check() == 0


def test_events_match_block_hashes_and_export_import():
    with Pool(device_blocks=16, block_tokens=4, event_capacity=64, hash_seed=5) as src, \
            Pool(device_blocks=16, block_tokens=4, hash_seed=5) as dst:
        s = src.open()
        toks = list(range(100, 110))
        src.append(s, toks)
        ev = src.events()
        assert [e.kind for e in ev] == [EventKind.STORED, EventKind.STORED]
        assert [e.seq for e in ev] == [1, 2]
        hashes = batchkv.block_hashes(toks, 4, hash_seed=5)
        assert list(hashes) == [e.hash for e in ev]
        assert ev[1].parent_hash == ev[0].hash and ev[1].has_parent == 1
        assert src.events() == []
        img = src.export(s)
        assert img.len == 10 and img.n_blocks == 3 and list(img.tokens) == toks
        assert list(img.hashes[:2]) == list(hashes) and img.hashes[2] == 0
        seq, transfers = dst.import_image(img)
        assert dst.info(seq).len == 10
        assert transfers.shape == (3, 2) and list(transfers[:, 0]) == list(img.blocks)
        assert list(transfers[:, 1]) == list(dst.blocks(seq))
        img.hashes[0] ^= np.uint64(1)                # a damaged image is refused
        with pytest.raises(batchkv.InvalidArgumentError):
            dst.import_image(img)



def test_export_import_carries_every_kv_group():
    from batchkv import GroupKind, KvGroup
    groups = [KvGroup(GroupKind.FULL, 2, 0, 256), KvGroup(GroupKind.WINDOW, 2, 12, 256),
              KvGroup(GroupKind.STATE, 1, 8, 5000)]
    kw = dict(device_blocks=96, block_tokens=4, max_seqs=8, state_units=6, groups=groups)
    with Pool(**kw) as src, Pool(**kw) as dst:
        s = src.open()
        toks = list(range(100, 137))
        src.append(s, toks[:36])
        src.append(s, toks[36:])                     # trims the window below block 6
        img = src.export(s)
        assert img.n_groups == 3 and img.state_frames == 3 and img.group_layout != 0
        assert list(img.group_blocks[0]) == list(src.group_blocks(s, 1))
        assert img.state_frame == src.state_frames(s)[1]   # the unit the append wrote
        seq, transfers = dst.import_image(img)
        win = dst.group_blocks(seq, 1)
        assert list(win[:6]) == [-1] * 6 and all(b >= 0 for b in win[6:])
        state_in = dst.state_frames(seq)[0]
        assert transfers.shape == (10 + 4 + 3, 2)
        assert list(transfers[:10, 1]) == list(dst.blocks(seq))
        assert list(transfers[10:14, 0]) == list(img.group_blocks[0][6:])
        assert list(transfers[10:14, 1]) == list(win[6:])
        assert list(transfers[14:, 0]) == [img.state_frame + j for j in range(3)]
        assert list(transfers[14:, 1]) == [state_in + j for j in range(3)]
        assert dst.check() == 0
        img.group_layout ^= 2                        # another pool's groups
        with pytest.raises(batchkv.InvalidArgumentError):
            dst.import_image(img)
        assert dst.check() == 0

def test_sizing_helpers():
    shape = batchkv.ModelShape(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)
    assert batchkv.kv_bytes_per_token(shape) == 2 * 32 * 8 * 128 * 2
    assert batchkv.blocks_for_bytes(2 ** 30, shape, 16) == 2 ** 30 // (131072 * 16)
    assert batchkv.kv_bytes_per_token((0, 1, 1, 1)) == 0


def test_hybrid_sizing_reproduces_gpt_oss_20b():
    from batchkv import GroupKind, KvGroup
    oss = [KvGroup(GroupKind.FULL, 12, 0, 2048), KvGroup(GroupKind.WINDOW, 12, 128, 2048)]
    full = [KvGroup(GroupKind.FULL, 24, 0, 2048)]
    assert batchkv.kv_seq_bytes(oss[:1], 32768) == 805306368
    assert batchkv.kv_seq_bytes(oss[1:], 32768) == 3145728
    assert batchkv.kv_seq_bytes(full, 32768) == 1610612736
    assert batchkv.kv_group_blocks_held(oss[1], 16, 32768) == 9
    assert batchkv.kv_group_page_bytes(oss[1], 16) == 16 * 12 * 2048
    assert batchkv.kv_frame_bytes(oss, 16) == 393216
    assert batchkv.kv_seq_bytes(oss, 32768, block_tokens=16) == (2049 + 9) * 393216
    assert batchkv.frames_for_bytes(80 << 30, oss, 16) == 218453
    assert batchkv.frames_for_bytes(80 << 30, full, 16) == 109226
    state = oss + [KvGroup(GroupKind.STATE, 36, 256, 1000000)]
    assert batchkv.kv_state_frames(state, 16) == 92
    assert batchkv.kv_state_frames(oss, 16) == 0
    assert batchkv.kv_frame_bytes([KvGroup(GroupKind.WINDOW, 12, 0, 2048)], 16) == 0


def test_pool_takes_groups_as_a_sequence():
    from batchkv import GroupKind, KvGroup
    with Pool(device_blocks=8, block_tokens=4, groups=[KvGroup(GroupKind.FULL, 4, 0, 1024)]) as p:
        seq = p.open()
        p.append(seq, list(range(9)))
        assert p.info(seq).n_blocks == 3
    with pytest.raises(batchkv.InvalidArgumentError):   # a window needs its span
        Pool(device_blocks=8, groups=[KvGroup(GroupKind.WINDOW, 4, 0, 1024)])


def test_roofline_prices_kv_groups():
    from batchkv import GroupKind, KvGroup
    d = batchkv.StepShape(kind=batchkv.CallKind.DECODE, decode_rows=1, decode_context=32768,
                          group_decode_context=(32768, 128))
    rl = batchkv.RooflineCost(batchkv.RooflinePreset.H100_SXM_LLAMA3_8B_BF16,
                              groups=[KvGroup(GroupKind.FULL, 12, 0, 2048),
                                      KvGroup(GroupKind.WINDOW, 12, 128, 2048)])
    assert rl.n_groups == 2 and rl.groups[1] == KvGroup(GroupKind.WINDOW, 12, 128, 2048)
    _, nbytes = rl.work(d)
    assert nbytes == pytest.approx(rl.model_bytes + 12 * 2048 * (32769 + 129))
    rl.groups = ()
    assert rl.n_groups == 0
    _, plain = rl.work(d)
    assert plain == pytest.approx(rl.model_bytes + 131072 * 32769)


def test_cost_models():
    poly = batchkv.PolyCost()
    assert poly.a == 1677 and poly.rows_ref == 32
    d = batchkv.StepShape(kind=batchkv.CallKind.DECODE, decode_rows=32, padded_rows=32)
    assert poly.step_us(d) == pytest.approx(1064 + 24.1 * 32)
    poly.d0 = 0
    assert poly.step_us(d) == pytest.approx(24.1 * 32)
    rl = batchkv.RooflineCost(batchkv.RooflinePreset.H100_SXM_LLAMA3_8B_BF16)
    flops, nbytes = rl.work(d)
    assert flops > 0 and nbytes > 0 and rl.step_us(d) > 0
    cal = batchkv.CalibratedCost(batchkv.PolyCost())
    assert cal.step_us(d) == pytest.approx(1064 + 24.1 * 32)
    for i in range(20):
        cal.observe(d, 500.0)
    assert cal.observations(batchkv.CallKind.DECODE) == 20
    # the first calls are clipped against the base (3.7x off) until the
    # scale widens, so the robust fit starts a little high and converges
    assert cal.step_us(d) == pytest.approx(500.0, rel=1e-2)
    for i in range(44):
        cal.observe(d, 500.0)
    assert cal.step_us(d) == pytest.approx(500.0, rel=2e-4)
    assert cal.coefficients(batchkv.CallKind.DECODE).shape == (9,)
    with pytest.raises(batchkv.InvalidArgumentError):
        cal.set_forget(0.5)
    cal.close()


def test_calibrated_cost_reports_its_confidence():
    d = batchkv.StepShape(kind=batchkv.CallKind.DECODE, decode_rows=32, padded_rows=32)
    cal = batchkv.CalibratedCost(batchkv.PolyCost())
    c = cal.confidence(batchkv.CallKind.DECODE)
    assert isinstance(c, batchkv.CalibConfidence)
    assert (c.n_eff, c.scale_fit, c.scale_base, c.level) == (0.0, 0.5, 0.5, 1.0)
    assert not c.trusted and not c.uses_fit
    for i in range(20):
        cal.observe(d, 500.0)
    c = cal.confidence(batchkv.CallKind.DECODE)
    assert c.trusted and c.uses_fit  # the base says 1,835 us: the fit is narrower
    assert 19.0 < c.n_eff < 20.0 and c.scale_fit < c.scale_base
    assert cal.confidence(batchkv.CallKind.PREFILL).n_eff == 0.0
    with pytest.raises(batchkv.InvalidArgumentError):
        cal.confidence(7)
    cal.close()


def test_records_read_every_field_of_their_struct():
    from batchkv import _ffi
    from batchkv.pool import _from_struct
    for rec, ctype in ((batchkv.StepInfo, _ffi.bkv_step_info),
                       (batchkv.SchedStats, _ffi.bkv_sched_stats),
                       (batchkv.PoolStats, _ffi.bkv_pool_stats)):
        s = ctype()
        for i, f in enumerate(rec._fields):
            v = getattr(s, f)
            if isinstance(v, ctypes.Array):    # per-group counts
                for j in range(len(v)):
                    v[j] = 1000 * i + j
            else:
                setattr(s, f, (i + 1) * 1.5 if "us" in f and f != "max_wait_us" and
                        isinstance(v, float) else i + 1000)
        got = _from_struct(rec, s)
        want = tuple(tuple(getattr(s, f)) if isinstance(getattr(s, f), ctypes.Array)
                     else getattr(s, f) for f in rec._fields)
        assert got == want, rec.__name__
        assert len(got) == len([f for f, _ in ctype._fields_ if f not in ("size", "reserved")])


def test_group_blocks_window_releases_what_no_later_token_reads():
    from batchkv import GroupKind, KvGroup
    groups = [KvGroup(GroupKind.FULL, 2, 0, 64), KvGroup(GroupKind.WINDOW, 2, 4, 64)]
    with Pool(device_blocks=32, block_tokens=4) as plain:
        s = plain.open()
        plain.append(s, range(9))
        assert list(plain.group_blocks(s, 0)) == list(plain.blocks(s))
        with pytest.raises(batchkv.NotFoundError):      # a plain pool has group 0 only
            plain.group_blocks(s, 1)
    with Pool(device_blocks=32, block_tokens=4, groups=groups) as p:
        s = p.open()
        p.append(s, range(8))
        g0, g1 = p.group_blocks(s, 0), p.group_blocks(s, 1)
        assert g0.dtype == np.int32 and list(g0) == list(p.blocks(s)) and len(g0) == 2
        # released lazily, at the next append: both blocks still held
        assert len(g1) == 2 and min(g1) >= 0 and not set(g1) & set(g0)
        for length in range(9, 17):                     # one token at a time
            p.append(s, [100 + length])
            g0, g1 = p.group_blocks(s, 0), p.group_blocks(s, 1)
            n = (length + 3) // 4
            assert len(g0) == len(g1) == n, length
            assert min(g0) >= 0                         # full attention keeps all
            # the append from length - 1 released the blocks below the one
            # holding position length - 4, the first its token read
            first = (length - 4) // 4
            assert list(g1[:first]) == [-1] * first, (length, list(g1))
            assert min(g1[first:]) >= 0, (length, list(g1))
            assert not set(g1[first:]) & set(g0)        # each group its own frames
            assert p.check() == 0
        assert first == 3 and list(g1[:3]) == [-1, -1, -1]
        with pytest.raises(batchkv.NotFoundError):
            p.group_blocks(s, 2)
        with pytest.raises(batchkv.NotFoundError):
            p.group_blocks(s + 1000, 1)


# A hybrid pool with a recurrent state: 4-token frames of 256 bytes, a state
# unit of 256 bytes (one frame), checkpoints every 8 tokens.
STATE_GROUPS = [batchkv.KvGroup(batchkv.GroupKind.FULL, 1, 0, 64),
                batchkv.KvGroup(batchkv.GroupKind.STATE, 1, 8, 256)]


def test_state_frames_out_of_place_and_committed_by_the_next_append():
    frames = batchkv.kv_state_frames(STATE_GROUPS, 4)
    assert frames == 1
    attention = 64 - 8 * frames          # the state arena lies above the attention frames
    with Pool(device_blocks=64, block_tokens=4, state_units=8, groups=STATE_GROUPS) as p:
        s = p.open()
        assert p.state_frames(s) == (-1, -1)          # nothing computed, nothing written
        p.append(s, range(5))
        i, o = p.state_frames(s)
        assert i == -1                                # read from the zero state
        assert attention <= o < 64 and (o - attention) % frames == 0
        p.append(s, [5])
        i2, o2 = p.state_frames(s)
        assert i2 == o                                # the next append committed it
        assert attention <= o2 < 64 and o2 != o       # written out of place
        assert p.check() == 0
        with pytest.raises(batchkv.NotFoundError):
            p.state_frames(s + 1000)
    with Pool(device_blocks=64, block_tokens=4,
              groups=STATE_GROUPS[:1]) as no_state, Pool(device_blocks=8) as plain:
        for q in (no_state, plain):
            s = q.open()
            q.append(s, range(5))
            with pytest.raises(batchkv.InvalidArgumentError):
                q.state_frames(s)


def test_pin_prefix_keeps_a_system_prompt_and_unpin_releases_it():
    sys_prompt = list(range(100, 108))  # two blocks of 4
    with Pool(device_blocks=4, block_tokens=4, pin_permille=500) as p:
        s = p.open()
        p.append(s, sys_prompt)
        p.close_seq(s)
        pin, got = p.pin_prefix(sys_prompt + [1, 2])
        assert got == 8
        assert p.stats().nr_used == 2
        with pytest.raises(batchkv.NoSpaceError):
            p.pin_prefix(sys_prompt)  # a second pin of it passes the share
        with pytest.raises(batchkv.NotFoundError):
            p.pin_prefix(sys_prompt, key=7)  # another tenant's salt
        p.unpin(pin)
        assert p.stats().nr_cached == 2
        with pytest.raises(batchkv.NotFoundError):
            p.unpin(pin)
