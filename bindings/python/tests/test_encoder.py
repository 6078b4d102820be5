"""Encoder inputs (images, audio) per request through Python:
Scheduler(encoder_cache=, encoder_budget=), submit(inputs=...), the batch's
encode and encoder_free, encoder_token, and the refusals. The host keeps an
encoder cache (a dict): it drops the encoder_free ids first, then runs each
encode entry, and every row must find the outputs of the inputs whose spans
it covers in that cache."""
import numpy as np
import pytest

import batchkv
from batchkv import ENCODE_DTYPE, FinishReason, Pool, Scheduler, encoder_token

PLACEHOLDER = 7  # what the submitted prompts hold at the inputs' spans


class EncoderHost:
    """Answers (last input token + 1) and plays the encoder: a cache of
    cache_id -> outputs (here: their count), within `cache` tokens, and at
    most `budget` encoder work per step (the driver resets step_cost)."""

    def __init__(self, cache, budget):
        self.cap = cache
        self.budget = budget
        self.cache = {}          # cache_id -> token_len of the cached outputs
        self.inputs = {}         # request id -> its inputs [(cache_id, start, len, cost)]
        self.step_cost = 0
        self.most_cost = 0       # most encoder work in one step
        self.encodes = 0         # inputs encoded
        self.frees = 0           # cache ids dropped
        self.checked = 0         # (row, input) pairs whose span a row read
        self.tokens = {}
        self.finished = {}

    def forward(self, b, next_tokens):
        free, enc = b.encoder_free, b.encode
        assert len(free) == b.n_encoder_free and free.dtype == np.uint64
        assert len(enc) == b.n_encode and enc.dtype == ENCODE_DTYPE
        assert not free.flags.writeable and not enc.flags.writeable
        for cid in free.tolist():          # drop first
            if self.cache.pop(cid, None) is not None:
                self.frees += 1
        for e in enc:                      # then encode
            cid, req, i, n = int(e["cache_id"]), int(e["req"]), int(e["input"]), int(e["len"])
            u = self.inputs[req][i]
            assert (u[0], u[2]) == (cid, n), "encode names input %d of request %d" % (i, req)
            self.step_cost += u[3] or u[2]
            self.cache[cid] = n
            self.encodes += 1
        if self.budget:
            assert self.step_cost <= self.budget
        self.most_cost = max(self.most_cost, self.step_cost)
        assert sum(self.cache.values()) <= self.cap, "the host's cache outgrew encoder_cache"
        tok, pos, qo = b.token_ids, b.positions, b.qo_indptr
        for r, req in enumerate(b.row_req.tolist()):
            start = int(pos[qo[r]])
            end = start + int(qo[r + 1] - qo[r])
            for k, (cid, a, n, _cost) in enumerate(self.inputs[req]):
                lo, hi = max(a, start), min(a + n, end)
                if lo >= hi:
                    continue
                assert self.cache.get(cid) == n, \
                    "row %d reads input %d (id %d) before it is encoded" % (r, k, cid)
                got = tok[qo[r] + lo - start:qo[r] + hi - start].tolist()
                assert got == [encoder_token(cid, p - a) for p in range(lo, hi)]
                self.checked += 1
        last = tok[qo[1:] - 1]
        next_tokens[:] = np.where(b.row_sample != 0, last + 1, 0)

    def on_token(self, req, branch, token, user):
        self.tokens.setdefault(req, []).append(token)

    def on_finish(self, req, reason, user):
        assert req not in self.finished, "ended twice"
        self.finished[req] = reason


def prompt_with(inputs, length, salt):
    """A prompt of `length` text tokens (salted so that prompts share no
    prefix) with the placeholder at the inputs' spans."""
    p = [1000 + 100 * salt + j for j in range(length)]
    for cid, a, n, _cost in inputs:
        p[a:a + n] = [PLACEHOLDER] * n
    return p


def draw(i, ids):
    """Request i's inputs: one to three of `ids` (cache id c is c + 2 tokens
    long, so that equal ids have equal lengths), spaced by text; costs 0
    (token_len) or explicit."""
    out, p = [], 1 + i % 3
    for k in range(1 + i % 3):
        cid = ids[(i * 7 + k * 3) % len(ids)]
        n = cid + 2
        out.append((cid, p, n, 0 if (i + k) % 2 else 1 + (i + k) % 4))
        p += n + 2
    return out, p + 2  # the prompt ends with text


def drive(s, host, reqs, max_new=3):
    ids = {}
    for i, (inputs, length) in enumerate(reqs):
        prompt = prompt_with(inputs, length, i)
        rid = s.submit(prompt, max_new, inputs=inputs, user=i)
        host.inputs[rid] = inputs
        ids[rid] = prompt[-1]
    while s.pending:
        host.step_cost = 0
        s.step()
    assert s.check() == 0
    assert host.finished == {r: FinishReason.LENGTH for r in ids}
    for r, last in ids.items():
        assert host.tokens[r] == [last + 1 + j for j in range(max_new)]
    return ids


@pytest.mark.parametrize("chunked", [0, 1])
def test_rows_read_encoded_inputs_and_repeated_ids_hit(chunked):
    # 10 requests over 3 images, each request salted (no prefix-cache hits):
    # a cache that holds them all encodes each id once
    host = EncoderHost(cache=64, budget=0)
    with Pool(device_blocks=256, block_tokens=4) as pool, \
            Scheduler(pool, host, encoder_cache=64, chunked_prefill=chunked,
                      token_budget=32) as s:
        reqs = [draw(i, [1, 2, 3]) for i in range(10)]
        drive(s, host, reqs)
        submitted = sum(len(u) for u, _ in reqs)
        assert host.checked >= submitted, "every input was read by some row"
        assert host.encodes == 3 < submitted, "repeated cache ids hit the encoder cache"
        assert host.frees == 0 and sorted(host.cache) == [1, 2, 3]
        st = s.stats()
        assert (st.encoder_runs, st.encoder_evictions) == (3, 0)
        assert st.encoder_lookups >= submitted and st.encoder_hits >= submitted - 3


def test_small_cache_and_budget_evict_and_stay_within_bounds():
    # 6 ids of 3..8 tokens in a 16-token cache, at most 8 encoder work per
    # step, chunks of 8 tokens: ids are evicted (encoder_free) and encoded
    # again, and no step exceeds the budget
    host = EncoderHost(cache=16, budget=8)
    with Pool(device_blocks=256, block_tokens=4) as pool, \
            Scheduler(pool, host, encoder_cache=16, encoder_budget=8, chunked_prefill=1,
                      token_budget=8, max_running=4) as s:
        reqs = [draw(i, [1, 2, 3, 4, 5, 6]) for i in range(12)]
        drive(s, host, reqs)
        submitted = sum(len(u) for u, _ in reqs)
        assert host.checked >= submitted
        assert host.frees > 0, "a 16-token cache evicted"
        assert host.encodes > 6, "evicted ids were encoded again"
        st = s.stats()
        assert (st.encoder_runs, st.encoder_evictions) == (host.encodes, host.frees)
        assert 0 < host.most_cost <= 8
        assert sum(host.cache.values()) <= 16


def test_the_prefix_cache_keys_a_span_by_its_input():
    # one submitted prompt (placeholders at [16, 24)) with image 1, image 2,
    # image 1 again: the second hits the 4 blocks before the span, the third
    # every full block but the last token's (7 of 4 tokens)
    host = EncoderHost(cache=32, budget=0)
    with Pool(device_blocks=64, block_tokens=4, pin_permille=500) as pool, \
            Scheduler(pool, host, encoder_cache=32) as s:
        prompt = list(range(300, 316)) + [PLACEHOLDER] * 8 + list(range(324, 332))
        hits = []
        for cid in (1, 2, 1):
            inputs = [(cid, 16, 8, 0)]
            rid = s.submit(prompt, 2, inputs=inputs)
            host.inputs[rid] = inputs
            s.run()
            hits.append(s.stats().hit_tokens)
        assert [hits[0], hits[1] - hits[0], hits[2] - hits[1]] == [0, 16, 28]
        assert host.encodes == 2, "image 1's outputs were still cached"
        assert s.check() == 0


def test_without_encoder_cache_inputs_are_refused_and_batches_carry_none():
    class Plain(EncoderHost):
        def forward(self, b, next_tokens):
            assert b.n_encode == 0 and len(b.encode) == 0 and b.encode.dtype == ENCODE_DTYPE
            assert b.n_encoder_free == 0 and len(b.encoder_free) == 0
            super().forward(b, next_tokens)

    host = Plain(cache=0, budget=0)
    with Pool(device_blocks=64) as pool, Scheduler(pool, host) as s:
        with pytest.raises(batchkv.InvalidArgumentError) as e:
            s.submit([1, 2, 3, 4], 2, inputs=[(5, 1, 2)])
        assert "bkv_request.n_inputs = 1" in str(e.value) and "encoder_cache" in str(e.value)
        assert s.stats().submitted == 0, "a refused request changes nothing"
        rid = s.submit([1, 2, 3], 2)
        host.inputs[rid] = []
        s.run()
        assert host.finished == {rid: FinishReason.LENGTH}


def test_inputs_that_could_never_pass_are_refused():
    host = EncoderHost(cache=8, budget=6)
    with Pool(device_blocks=64) as pool, \
            Scheduler(pool, host, encoder_cache=8, encoder_budget=6, chunked_prefill=1) as s:
        prompt = list(range(1, 21))
        with pytest.raises(batchkv.TooBigError) as e:   # longer than the cache
            s.submit(prompt, 2, inputs=[(5, 2, 9, 1)])
        assert "bkv_request.inputs[0].token_len = 9" in str(e.value)
        assert "encoder_cache" in str(e.value)
        with pytest.raises(batchkv.TooBigError) as e:   # costlier than the budget
            s.submit(prompt, 2, inputs=[(5, 2, 4, 7)])
        assert "encoder_budget" in str(e.value)
        with pytest.raises(batchkv.TooBigError):        # cost 0 = token_len 7 > 6
            s.submit(prompt, 2, inputs=[(5, 2, 7)])
        with pytest.raises(batchkv.InvalidArgumentError):  # spans out of order
            s.submit(prompt, 2, inputs=[(5, 8, 2, 0), (6, 2, 2, 0)])
        with pytest.raises(batchkv.InvalidArgumentError):  # past the prompt
            s.submit(prompt, 2, inputs=[(5, 19, 2, 0)])
        with pytest.raises(batchkv.InvalidArgumentError):  # cache_id 0
            s.submit(prompt, 2, inputs=[(0, 2, 2, 0)])
        many = [(1, 2 * k, 1, 0) for k in range(batchkv._ffi.BKV_MAX_ENCODER_INPUTS + 1)]
        with pytest.raises(batchkv.InvalidArgumentError) as e:  # too many
            s.submit(list(range(1, 200)), 2, inputs=many)
        assert "n_inputs = 65" in str(e.value)
        assert s.stats().submitted == 0


def test_encoder_token_lies_below_every_other_id():
    t = [encoder_token(c, i) for c in (1, 2, 2 ** 64 - 1) for i in range(16)]
    assert all(x <= -(2 ** 23) for x in t)
    deepest = batchkv.token_pending_at(batchkv.OVERLAP_MAX_DEPTH,
                                       batchkv._ffi.BKV_TOKEN_PENDING_ROWS - 1)
    assert all(x < deepest and not batchkv.token_is_pending(x) for x in t), \
        "below TOKEN_FAIL and every overlap placeholder, at every depth"
    assert encoder_token(7, 3) == encoder_token(7, 3), "a function of (cache_id, i)"
    assert len(set(t)) == len(t)
