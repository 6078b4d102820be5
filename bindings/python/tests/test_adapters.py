"""Adapters (LoRA) per request through Python: Scheduler(max_adapters=N),
submit(adapter=...), the batch's row_adapter and adapters, the refusals,
and adapter_cache_key, the pool key an adapter's blocks are cached under."""
import numpy as np
import pytest

import batchkv
from batchkv import FinishReason, Pool, Scheduler, adapter_cache_key


def answer(b, next_tokens):
    last = b.token_ids[b.qo_indptr[1:] - 1]
    next_tokens[:] = np.where(b.row_sample != 0, last + 1, 0)


class AdapterHost:
    """Answers (last input token + 1) and checks every call's adapters:
    each row's entry of row_adapter is its request's adapter (the user
    object), the call's distinct nonzero adapters are at most the cap and
    are exactly `adapters`, in the order of their first row."""

    def __init__(self, cap):
        self.cap = cap
        self.most = 0          # most distinct adapters in one call
        self.seen = set()      # every adapter a call carried
        self.finished = {}
        self.tokens = {}

    def forward(self, b, next_tokens):
        ra = b.row_adapter
        assert ra.dtype == np.uint32 and len(ra) == b.n_rows and not ra.flags.writeable
        assert ra.tolist() == [u["adapter"] for u in b.users]
        distinct = []
        for a in ra.tolist():
            if a and a not in distinct:
                distinct.append(a)
        assert len(distinct) <= self.cap, distinct
        assert b.n_adapters == len(distinct)
        assert b.adapters.tolist() == distinct
        self.most = max(self.most, len(distinct))
        self.seen.update(distinct)
        answer(b, next_tokens)

    def on_token(self, req, branch, token, user):
        self.tokens.setdefault(req, []).append(token)

    def on_finish(self, req, reason, user):
        self.finished[req] = reason


def test_no_call_carries_more_adapters_than_max_adapters():
    # three adapters under a cap of two, long prompts in chunks of a small
    # budget so that prompts admitted earlier keep joining calls
    host = AdapterHost(cap=2)
    pool = Pool(device_blocks=128, block_tokens=4)
    s = Scheduler(pool, host, max_adapters=2, adapter_wait_us=2000, chunked_prefill=1,
                  token_budget=16, max_running=6)
    ids = {}
    for i in range(12):
        a = 1 + i % 3
        prompt = [1000 * a + i] * 20 + [i]
        ids[s.submit(prompt, 4 + i % 3, user={"adapter": a}, adapter=a)] = (prompt, 4 + i % 3)
    s.run()
    assert s.pending == 0 and s.check() == 0
    assert host.finished == {r: FinishReason.LENGTH for r in ids}
    for r, (prompt, n) in ids.items():
        assert host.tokens[r] == [prompt[-1] + 1 + j for j in range(n)]
    assert host.most == 2, "some call carried two adapters"
    assert host.seen == {1, 2, 3}
    assert s.stats().adapter_passes > 0, "the third adapter's requests were passed"
    s.close()
    pool.close()


def test_without_max_adapters_an_adapter_is_refused_and_batches_carry_none():
    class NoAdapters(AdapterHost):
        def forward(self, b, next_tokens):
            assert len(b.row_adapter) == 0, "NULL without max_adapters: an empty view"
            assert b.n_adapters == 0 and len(b.adapters) == 0
            answer(b, next_tokens)

    host = NoAdapters(cap=0)
    with Pool(device_blocks=64) as pool:
        s = Scheduler(pool, host)
        with pytest.raises(batchkv.InvalidArgumentError) as e:
            s.submit([1, 2, 3], 2, adapter=3)
        assert "bkv_request.adapter = 3" in str(e.value) and "max_adapters" in str(e.value)
        assert s.stats().submitted == 0, "a refused request changes nothing"
        rid = s.submit([1, 2, 3], 2, user={"adapter": 0})
        s.run()
        assert host.finished == {rid: FinishReason.LENGTH}
        s.close()
        with pytest.raises(batchkv.InvalidArgumentError) as e:
            Scheduler(pool, host, max_adapters=batchkv._ffi.BKV_MAX_ADAPTERS + 1)
        assert "bkv_sched_config.max_adapters = 1025" in str(e.value)
        with pytest.raises(batchkv.InvalidArgumentError) as e:
            Scheduler(pool, host, max_adapters=2, pad0=1)
        assert "bkv_sched_config.pad0 = 1" in str(e.value)
        with pytest.raises(batchkv.InvalidArgumentError) as e:
            Scheduler(pool, host, max_adapters=2, adapter_wait_us=(1 << 42) + 1)
        assert "bkv_sched_config.adapter_wait_us" in str(e.value)


def test_adapter_cache_key_keeps_adapters_apart():
    assert adapter_cache_key(5, 0) == 5
    assert adapter_cache_key(0, 1) != 0
    assert adapter_cache_key(0, 1) != adapter_cache_key(0, 2)
    assert adapter_cache_key(5, 1) != adapter_cache_key(0, 1)
    assert adapter_cache_key(0, 1) != 1, "not the plain key 1 of a tenant"
    assert adapter_cache_key(2 ** 64 - 1, 1024) == adapter_cache_key(2 ** 64 - 1, 1024)
    # the same prompt under adapter 1, adapter 2, adapter 1 again and the
    # base model: only the second adapter-1 request hits (7 full blocks of 4)
    host = AdapterHost(cap=2)
    pool = Pool(device_blocks=64, block_tokens=4, pin_permille=500)
    s = Scheduler(pool, host, max_adapters=2)
    prompt = list(range(300, 332))
    hits = []
    for a in (1, 2, 1, 0):
        s.submit(prompt, 2, user={"adapter": a}, adapter=a)
        s.run()
        hits.append(s.stats().hit_tokens)
    assert hits == [0, 0, 28, 28]
    s.close()
    # the adapter's blocks are in the cache under its key, not under 0 or
    # under another adapter's
    pin, got = pool.pin_prefix(prompt, key=adapter_cache_key(0, 1))
    assert got == 32, "the prompt's 8 full blocks"
    pool.unpin(pin)
    pin, got2 = pool.pin_prefix(prompt, key=adapter_cache_key(0, 2))
    assert got2 == got
    pool.unpin(pin)
    with pytest.raises(batchkv.NotFoundError):
        pool.pin_prefix(prompt, key=adapter_cache_key(0, 3))
    pool.close()
