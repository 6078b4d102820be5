"""A real (tiny) numpy transformer served through batchkv, token for token
against each request run alone over a contiguous cache (tinylm_np.py), through
prefix hits, forks (n > 1), swap and recompute preemption, chunked prefill on
a split host, and host failures rolled back mid-run."""
import pytest

import batchkv
from tinylm_np import PagedHost, SplitHost, TinyLM, workload

BT = 4


@pytest.fixture(scope="module")
def model():
    return TinyLM()


def serve(host, jobs, pool_kw, sched_kw, fail_every=0):
    pool = batchkv.Pool(block_tokens=BT, **pool_kw)
    s = batchkv.Scheduler(pool, host, **sched_kw)
    for j in jobs:
        j.req = s.submit(j.prompt, j.max_new, stop_tokens=j.stop, n=j.n, user=j)
    steps = failures = 0
    while s.pending:
        if fail_every and steps % fail_every == fail_every - 1:
            host.fail_next = True
        try:
            s.step()
        except RuntimeError as e:
            assert "injected host failure" in str(e)
            failures += 1
        steps += 1
        assert steps < 5000, "stuck"
        assert s.check() == 0
    st, ps = s.stats(), pool.stats()
    s.close()
    pool.close()
    return st, ps, failures


def verify(jobs):
    for j in jobs:
        assert j.finished == 1, "request %d ended %d times" % (j.req, j.finished)
        assert j.got == j.ref, "request %d (n=%d): served %s, alone %s" % (j.req, j.n, j.got, j.ref)


def fresh(model, **kw):
    return workload(model, block_tokens=BT, **kw)


def test_prefix_hits_and_forks(model):
    jobs = fresh(model)
    host = PagedHost(model, BT, 256)
    st, ps, _ = serve(host, jobs, dict(device_blocks=256), dict(max_running=16))
    verify(jobs)
    assert st.hit_tokens > 0 and ps.hit_tokens == st.hit_tokens
    assert any(j.n > 1 for j in jobs) and ps.cow_copies > 0
    assert st.preemptions == 0


def test_swap_preemption(model):
    jobs = fresh(model, long=True)
    host = PagedHost(model, BT, 32, 256)
    st, ps, _ = serve(host, jobs, dict(device_blocks=32, host_blocks=256),
                      dict(max_running=8, preempt=batchkv.Preempt.SWAP))
    verify(jobs)
    assert st.swaps > 0 and host.copies["swap_out"] > 0 and host.copies["swap_in"] > 0
    assert st.hit_tokens > 0


def test_recompute_preemption(model):
    jobs = fresh(model, long=True)
    host = PagedHost(model, BT, 32)
    st, ps, _ = serve(host, jobs, dict(device_blocks=32),
                      dict(max_running=8, preempt=batchkv.Preempt.RECOMPUTE))
    verify(jobs)
    assert st.preemptions > 0 and st.swaps == 0


def test_chunked_prefill_on_a_split_host(model):
    jobs = fresh(model)
    host = SplitHost(model, BT, 40, 128)
    st, ps, _ = serve(host, jobs, dict(device_blocks=40, host_blocks=128),
                      dict(max_running=8, chunked_prefill=1, token_budget=12))
    verify(jobs)
    assert host.calls[1] > 0 and host.calls[2] > 0 and host.calls[0] == 0
    assert st.prefill_calls > 0 and st.decode_calls > 0


def test_host_exceptions_roll_back_and_lose_nothing(model):
    jobs = fresh(model, long=True)
    host = PagedHost(model, BT, 32, 256)
    st, ps, failures = serve(host, jobs, dict(device_blocks=32, host_blocks=256),
                             dict(max_running=8, preempt=batchkv.Preempt.SWAP), fail_every=3)
    verify(jobs)
    assert failures > 5 and st.failed_steps == failures
    assert st.preemptions > 0
