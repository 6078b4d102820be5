"""tinylm_np - examples/tinylm's shape in numpy: a real (tiny) decoder-only
transformer served through batchkv, and the contiguous reference it must
equal token for token.

The model: token embedding, RMSNorm, rotary positions, grouped-query attention
(fewer KV heads than query heads), a SwiGLU MLP and an untied LM head, weights
from a fixed-seed generator. As in the C example, both drivers share every
floating-point operation, one token at a time:

  ref_generate   one request alone, K/V in a contiguous [layer][pos] array;
                 a fork copies the prompt's cache per branch;
  PagedHost      batchkv batches over one device tensor of slots
                 [block * block_tokens + offset][layer][kv_width] and a host
                 tensor for swap, reading K/V only through the batch's block
                 tables (kv_indptr/kv_indices) and writing at slot_mapping.

Token t at position p is computed from exactly the K/V of positions 0..p, so
"batched == alone" is exact: any difference is the library showing the host
the wrong blocks (or the wrong copies), never rounding.
"""
import numpy as np

M64 = (1 << 64) - 1


def mix64(x):
    """splitmix64 (the C example's tlm_mix64)."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def sample(logits, n_samples, seed, branch, pos):
    """Greedy for n == 1; else branch b draws from softmax(logits / 0.8) with a
    uniform named by (seed, branch, pos), so runs repeat and branches differ."""
    if n_samples == 1:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / 0.8
    p = np.exp(z - z.max())
    c = np.cumsum(p)
    u = (mix64(seed ^ mix64((branch << 32) | pos)) >> 11) / float(1 << 53) * c[-1]
    return min(int(np.searchsorted(c, u, side="right")), len(logits) - 1)


class TinyLM:
    """A small transformer; the defaults make about 30 k parameters."""

    def __init__(self, vocab=48, dim=32, layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                 ffn=64, max_pos=256, seed=7):
        self.vocab, self.dim, self.layers = vocab, dim, layers
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.kv_width = n_kv_heads * head_dim
        rng = np.random.default_rng(seed)

        def w(*shape):
            return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

        self.embed = w(vocab, dim) * np.float32(4.0)
        self.L = [dict(attn_norm=1 + 0.1 * w(dim), wq=w(dim, n_heads * head_dim),
                       wk=w(dim, self.kv_width), wv=w(dim, self.kv_width),
                       wo=w(n_heads * head_dim, dim), mlp_norm=1 + 0.1 * w(dim),
                       gate=w(dim, ffn), up=w(dim, ffn), down=w(ffn, dim))
                  for _ in range(layers)]
        self.final_norm = 1 + 0.1 * w(dim)
        self.lm_head = w(dim, vocab) * np.float32(3.0)
        freq = 10000.0 ** (-np.arange(0, head_dim, 2) / head_dim)
        ang = np.arange(max_pos)[:, None] * freq[None, :]
        self.cos, self.sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        self.group = np.arange(n_heads) // (n_heads // n_kv_heads)

    @staticmethod
    def _norm(x, g):
        return x / np.sqrt(np.mean(x * x) + np.float32(1e-5)) * g

    def _rope(self, v, pos):
        c, s = self.cos[pos], self.sin[pos]
        out = np.empty_like(v)
        out[:, 0::2] = v[:, 0::2] * c - v[:, 1::2] * s
        out[:, 1::2] = v[:, 0::2] * s + v[:, 1::2] * c
        return out

    def token(self, tok, pos, write, read):
        """Hidden row of token tok at position pos. write(l, k, v) stores
        this token's K/V of layer l; read(l) returns (K, V) of positions
        0..pos, each [pos + 1][kv_width]."""
        x = self.embed[tok]
        hd = self.head_dim
        for l, L in enumerate(self.L):
            h = self._norm(x, L["attn_norm"])
            q = self._rope((h @ L["wq"]).reshape(self.n_heads, hd), pos)
            k = self._rope((h @ L["wk"]).reshape(self.n_kv_heads, hd), pos).reshape(-1)
            v = h @ L["wv"]
            write(l, k, v)
            K, V = read(l)
            Kh = K.reshape(-1, self.n_kv_heads, hd)[:, self.group, :]  # [ctx][heads][hd]
            Vh = V.reshape(-1, self.n_kv_heads, hd)[:, self.group, :]
            s = np.einsum("chd,hd->hc", Kh, q) / np.float32(np.sqrt(hd))
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            a = np.einsum("hc,chd->hd", s, Vh).reshape(-1)
            x = x + a @ L["wo"]
            h = self._norm(x, L["mlp_norm"])
            g = h @ L["gate"]
            x = x + ((g / (1 + np.exp(-g))) * (h @ L["up"])) @ L["down"]
        return x

    def logits(self, x):
        return self._norm(x, self.final_norm) @ self.lm_head


def ref_generate(m, prompt, max_new, stop=(), n=1, seed=0):
    """The answer key: each branch's tokens for one request alone."""
    total = len(prompt) + max_new
    K = np.zeros((m.layers, total, m.kv_width), np.float32)
    V = np.zeros_like(K)

    def run(Kc, Vc, tok, p):
        def write(l, k, v):
            Kc[l, p], Vc[l, p] = k, v

        return m.token(tok, p, write, lambda l: (np.ascontiguousarray(Kc[l, :p + 1]),
                                                 np.ascontiguousarray(Vc[l, :p + 1])))

    for p, t in enumerate(prompt):
        x = run(K, V, int(t), p)
    first = m.logits(x)
    outs = []
    for b in range(n):
        Kb, Vb = K.copy(), V.copy()
        out = []
        t = sample(first, n, seed, b, len(prompt))
        while True:
            out.append(t)
            if len(out) == max_new or t in stop:
                break
            p = len(prompt) + len(out) - 1
            t = sample(m.logits(run(Kb, Vb, t, p)), n, seed, b, p + 1)
        outs.append(out)
    return outs


class Job:
    """One request of a workload: its inputs, reference and what was served."""

    def __init__(self, prompt, max_new, stop, n, seed):
        self.prompt, self.max_new, self.stop, self.n, self.seed = prompt, max_new, stop, n, seed
        self.ref = None
        self.got = [[] for _ in range(n)]
        self.finished = 0
        self.reason = None
        self.req = None


class PagedKV:
    """TinyLM over paged K/V (see the module doc): compute(batch, next_tokens)
    serves any batch. fail_next: raise from the next call after performing
    its copies and writing part of its K/V (a late failure the library must
    roll back)."""

    def __init__(self, model, block_tokens, device_blocks, host_blocks=0):
        self.m = model
        self.bt = block_tokens
        shape = (model.layers, model.kv_width)
        self.dk = np.zeros((device_blocks * block_tokens,) + shape, np.float32)
        self.dv = np.zeros_like(self.dk)
        self.hk = np.zeros((max(host_blocks, 1) * block_tokens,) + shape, np.float32)
        self.hv = np.zeros_like(self.hk)
        self.fail_next = False
        self.calls = {0: 0, 1: 0, 2: 0}
        self.copies = {"copies": 0, "swap_out": 0, "swap_in": 0}

    def _blockcopy(self, pairs, src_k, src_v, dst_k, dst_v):
        bt = self.bt
        for s, d in pairs:
            dst_k[d * bt:(d + 1) * bt] = src_k[s * bt:(s + 1) * bt]
            dst_v[d * bt:(d + 1) * bt] = src_v[s * bt:(s + 1) * bt]

    def compute(self, b, next_tokens):
        bt = self.bt
        self._blockcopy(b.swap_out, self.dk, self.dv, self.hk, self.hv)
        self._blockcopy(b.swap_in, self.hk, self.hv, self.dk, self.dv)
        self._blockcopy(b.copies, self.dk, self.dv, self.dk, self.dv)
        self.copies["swap_out"] += len(b.swap_out)
        self.copies["swap_in"] += len(b.swap_in)
        self.copies["copies"] += len(b.copies)
        self.calls[b.kind] += 1
        qo, kvp, kvi = b.qo_indptr, b.kv_indptr, b.kv_indices
        tok, pos, slots = b.token_ids, b.positions, b.slot_mapping
        users, sample_row, branch = b.users, b.row_sample, b.row_branch
        assert b.n_decode_rows <= b.n_rows
        for r in range(b.n_rows):
            blocks = np.array(kvi[kvp[r]:kvp[r + 1]])
            if r < b.n_decode_rows:
                assert qo[r + 1] - qo[r] == 1, "a decode row with more than one token"
            x = None
            for i in range(qo[r], qo[r + 1]):
                p, slot = int(pos[i]), int(slots[i])
                assert slot == blocks[p // bt] * bt + p % bt, "slot_mapping vs block table"
                ctx = np.arange(p + 1)
                ctx_slots = blocks[ctx // bt] * bt + ctx % bt

                def write(l, k, v, slot=slot):
                    self.dk[slot, l], self.dv[slot, l] = k, v

                def read(l, ctx_slots=ctx_slots):
                    return self.dk[ctx_slots, l], self.dv[ctx_slots, l]

                x = self.m.token(int(tok[i]), p, write, read)
                if self.fail_next:
                    self.fail_next = False
                    raise RuntimeError("injected host failure")
            assert int(b.kv_last_page_len[r]) == int(pos[qo[r + 1] - 1]) % bt + 1
            if sample_row[r]:
                job = users[r]
                next_tokens[r] = sample(self.m.logits(x), job.n, job.seed, int(branch[r]),
                                        int(pos[qo[r + 1] - 1]) + 1)

    def on_token(self, req, branch, token, job):
        job.got[branch].append(token)

    def on_finish(self, req, reason, job):
        job.finished += 1
        job.reason = reason


class PagedHost(PagedKV):
    """A mixed-batch host: forward()."""

    def forward(self, b, next_tokens):
        assert b.kind == 0
        return self.compute(b, next_tokens)


class SplitHost(PagedKV):
    """The same model as split kernels: prefill() and decode()."""

    def prefill(self, b, next_tokens):
        assert b.kind == 1 and b.n_decode_rows == 0
        return self.compute(b, next_tokens)

    def decode(self, b, next_tokens):
        assert b.kind == 2 and b.n_decode_rows == b.n_rows
        return self.compute(b, next_tokens)


def workload(m, n_jobs=20, block_tokens=4, seed=3, fork_every=4, stop_every=5, long=False):
    """Jobs sharing two system prompts (prefix hits), every fork_every-th with
    n = 2 or 3 (forks), every stop_every-th with a stop token."""
    rng = np.random.default_rng(seed)
    systems = [list(rng.integers(0, m.vocab, 2 * block_tokens + 1)) for _ in range(2)]
    jobs = []
    for j in range(n_jobs):
        prompt = [int(t) for t in systems[j % 2]] + [int(t) for t in
                                                     rng.integers(0, m.vocab, 1 + j % 5)]
        n = 2 + j % 2 if j % fork_every == fork_every - 1 else 1
        stop = (int(rng.integers(0, m.vocab)),) if j % stop_every == 0 else ()
        jobs.append(Job(prompt, (10 + 3 * (j % 7)) if long else 4 + j % 7, stop, n,
                        seed=1000 + j))
    for job in jobs:
        job.ref = ref_generate(m, job.prompt, job.max_new, job.stop, job.n, job.seed)
    return jobs
