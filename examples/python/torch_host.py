#!/usr/bin/env python3
"""torch_host.py - a PyTorch host for batchkv: a Llama-shaped model served
through the library's batches, token for token against a contiguous reference.

The model: token embedding, RMSNorm, rotary positions (Llama's rotate-half),
grouped-query attention (fewer KV heads than query heads), a SwiGLU MLP and an
untied LM head; random weights from torch.manual_seed. Its K/V lives in torch
tensors, one pair per layer, shaped [blocks, block_tokens, kv_heads, head_dim]
(device tier) plus a host tier of the same shape for swap (pinned on CUDA).

  TorchHost.forward   serves any mixed batch: performs swap_out, swap_in and
                      copies as tensor copies, reads each row's block table
                      from the flat kv_indptr/kv_indices or, in the persistent
                      layout, from its own mirror of the row slots' tables
                      rebuilt from table_deltas/delta_blocks (and checked
                      against groups[0].row_table), writes K/V at
                      slot_mapping, samples into next_tokens, and verifies
                      drafts (spec_tokens) for rows that carry them.
  TorchHost.draft     speculation's draft model: the model's own first
                      draft_layers layers (then its final norm and LM head),
                      greedy, over a per-branch contiguous draft cache.
  ref_generate        the answer key: one request alone over a contiguous
                      [layers, positions, kv_heads, head_dim] cache.

Exactness: in mode "exact" (the default) both paths compute every token one
position at a time with the same operations on tensors of the same shapes
(the K/V of positions 0..p, gathered from the blocks or sliced from the
contiguous cache), so "served == alone" holds bit for bit in float32 on the
CPU: any difference is the library handing the host the wrong blocks, copies
or tables. Mode "batched" computes a whole batch at once (one projection per
layer over all tokens, a padded gather for decode rows, causal SDPA per
prefill chunk): the real step a GPU runs, for timing (gpu_step_times.py); it
agrees with the reference up to rounding only.

    python3 examples/python/torch_host.py [--device cpu|cuda] [--requests N]

serves ~40 requests with shared prefixes, n = 2 forks, stop tokens and a small
pool that forces swap preemption, in the flat and persistent layouts, with and
without speculation, and exits 0 only when every token matches.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

try:
    import batchkv
except ImportError:  # run from a checkout: the bindings beside the examples
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "bindings", "python"))
    import batchkv

M64 = (1 << 64) - 1


def mix64(x):
    """splitmix64: names a sampling uniform by (seed, branch, position)."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def sample(logits, n_samples, seed, branch, pos):
    """Greedy for n == 1; else branch b draws from softmax(logits / 0.8) with a
    uniform named by (seed, branch, pos), so runs repeat and branches differ.
    logits: a 1-D tensor (any device)."""
    if n_samples == 1:
        return int(torch.argmax(logits))
    z = logits.detach().double().cpu().numpy() / 0.8
    p = np.exp(z - z.max())
    c = np.cumsum(p)
    u = (mix64(seed ^ mix64((branch << 32) | pos)) >> 11) / float(1 << 53) * c[-1]
    return min(int(np.searchsorted(c, u, side="right")), len(z) - 1)


def _attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d), masked) v over [heads, tokens, d]: SDPA where
    this torch has it (2.0 on), else the same in plain operations."""
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if sdpa is not None:
        return sdpa(q, k, v, attn_mask=mask)
    s = (q @ k.transpose(-1, -2)) / float(np.sqrt(q.shape[-1]))
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v


class Llama:
    """A Llama-shaped decoder with random weights (torch.manual_seed(seed))."""

    def __init__(self, vocab=64, dim=64, layers=4, n_heads=4, n_kv_heads=2, head_dim=16,
                 ffn=128, max_pos=512, seed=7, device="cpu", dtype=torch.float32,
                 draw_on_device=False):
        self.vocab, self.dim, self.layers = vocab, dim, layers
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.device, self.dtype = torch.device(device), dtype
        g = torch.Generator().manual_seed(seed)

        if draw_on_device:  # large models for timing: drawn where they live
            torch.manual_seed(seed)

        def w(*shape):  # drawn on the CPU in float32: the same weights on every device
            if draw_on_device:
                return torch.randn(*shape, device=self.device, dtype=dtype) / float(
                    np.sqrt(shape[0]))
            t = torch.randn(*shape, generator=g) / float(np.sqrt(shape[0]))
            return t.to(self.device, dtype)

        self.embed = w(vocab, dim) * 4.0
        self.L = [dict(attn_norm=1 + 0.1 * w(dim), wq=w(dim, n_heads * head_dim),
                       wk=w(dim, n_kv_heads * head_dim), wv=w(dim, n_kv_heads * head_dim),
                       wo=w(n_heads * head_dim, dim), mlp_norm=1 + 0.1 * w(dim),
                       gate=w(dim, ffn), up=w(dim, ffn), down=w(ffn, dim))
                  for _ in range(layers)]
        self.final_norm = 1 + 0.1 * w(dim)
        self.lm_head = w(dim, vocab) * 3.0
        inv = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=1)  # rotate-half layout
        self.cos = ang.cos().to(self.device, dtype)
        self.sin = ang.sin().to(self.device, dtype)
        self.group = torch.arange(n_heads, device=self.device) // (n_heads // n_kv_heads)
        self.params = sum(t.numel() for t in [self.embed, self.final_norm, self.lm_head]) + \
            sum(t.numel() for L in self.L for t in L.values())

    @staticmethod
    def _norm(x, g):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * g

    def _rope(self, v, pos):
        """v [..., heads, head_dim] at positions pos (an int or a [...] tensor)."""
        c, s = self.cos[pos], self.sin[pos]
        if not isinstance(pos, int):
            c, s = c.unsqueeze(-2), s.unsqueeze(-2)
        h = self.head_dim // 2
        rot = torch.cat([-v[..., h:], v[..., :h]], dim=-1)
        return v * c + rot * s

    # -- one token at a time (exact) -----------------------------------------
    def token(self, tok, pos, write, read, layers=None):
        """Hidden row of token tok at position pos through the first `layers`
        layers (all by default). write(l, k, v) stores this token's K/V of
        layer l ([kv_heads, head_dim] each); read(l) returns (K, V) of
        positions 0..pos, each a contiguous [pos + 1, kv_heads, head_dim]."""
        x = self.embed[tok]
        hd = self.head_dim
        for l, L in enumerate(self.L[:layers]):
            h = self._norm(x, L["attn_norm"])
            q = self._rope((h @ L["wq"]).view(self.n_heads, hd), pos)
            k = self._rope((h @ L["wk"]).view(self.n_kv_heads, hd), pos)
            v = (h @ L["wv"]).view(self.n_kv_heads, hd)
            write(l, k, v)
            K, V = read(l)
            Kh, Vh = K[:, self.group, :], V[:, self.group, :]  # [ctx, heads, hd]
            s = torch.einsum("chd,hd->hc", Kh, q) / float(np.sqrt(hd))
            a = torch.einsum("hc,chd->hd", torch.softmax(s, dim=-1), Vh).reshape(-1)
            x = x + a @ L["wo"]
            h = self._norm(x, L["mlp_norm"])
            x = x + (torch.nn.functional.silu(h @ L["gate"]) * (h @ L["up"])) @ L["down"]
        return x

    def logits(self, x):
        return self._norm(x, self.final_norm) @ self.lm_head


def ref_generate(m, prompt, max_new, stop=(), n=1, seed=0):
    """The answer key: each branch's tokens for one request alone, over a
    contiguous cache; a fork copies the prompt's cache per branch."""
    total = len(prompt) + max_new
    K = torch.zeros(m.layers, total, m.n_kv_heads, m.head_dim, device=m.device, dtype=m.dtype)
    V = torch.zeros_like(K)

    def run(Kc, Vc, tok, p):
        def write(l, k, v):
            Kc[l, p], Vc[l, p] = k, v

        return m.token(tok, p, write, lambda l: (Kc[l, :p + 1], Vc[l, :p + 1]))

    with torch.no_grad():
        for p, t in enumerate(prompt):
            x = run(K, V, int(t), p)
        first = m.logits(x)
        outs = []
        for b in range(n):
            Kb, Vb = K.clone(), V.clone()
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
        self.req = None


class TorchHost:
    """The model over paged K/V in torch tensors (see the module doc).

    kv_k[l], kv_v[l]: [device_blocks, block_tokens, kv_heads, head_dim] on
    the model's device; host_k[l], host_v[l]: the host tier for swap."""

    def __init__(self, model, block_tokens, device_blocks, host_blocks=0, mode="exact",
                 draft_layers=None, draft_k=3, checks=True):
        self.m = model
        self.bt = block_tokens
        shape = (block_tokens, model.n_kv_heads, model.head_dim)
        dev, dt = model.device, model.dtype
        self.kv_k = [torch.zeros((device_blocks,) + shape, device=dev, dtype=dt)
                     for _ in range(model.layers)]
        self.kv_v = [torch.zeros_like(t) for t in self.kv_k]
        pin = dev.type == "cuda"
        self.host_k = [torch.zeros((max(host_blocks, 1),) + shape, dtype=dt, pin_memory=pin)
                       for _ in range(model.layers)]
        self.host_v = [torch.zeros((max(host_blocks, 1),) + shape, dtype=dt, pin_memory=pin)
                       for _ in range(model.layers)]
        self.mode = mode
        self.checks = checks              # verify slot_mapping and tables against positions
        self.tables = {}                  # persistent layout: row slot -> its block table
        self.draft_layers = draft_layers if draft_layers is not None else max(1, model.layers // 2)
        self.draft_k = draft_k
        self._drafts = {}                 # (req, branch) -> (tokens, K, V) of the draft model
        self.counts = dict(calls=0, copies=0, swap_out=0, swap_in=0, deltas=0, drafts=0,
                           spec_rows=0)
        self.call_log = None              # a list to record (shape, seconds) per call, or None
        self.virtual_clock = None         # microseconds, or None: the real clock (now_us)

    # -- copies ---------------------------------------------------------------
    @staticmethod
    def _copy(pairs, src, dst):
        """Block copies (n, 2) src -> dst, one index copy per layer; pairs
        that chain (a destination read later as a source) go one by one."""
        if not len(pairs):
            return
        s = torch.as_tensor(np.array(pairs[:, 0]), dtype=torch.long)
        d = torch.as_tensor(np.array(pairs[:, 1]), dtype=torch.long)
        chained = src[0] is dst[0] and bool(np.intersect1d(pairs[:, 0], pairs[:, 1]).size)
        for S, D in zip(src, dst):
            if chained:
                for a, b in pairs.tolist():
                    D[b].copy_(S[a])
            else:
                D[d.to(D.device)] = S[s.to(S.device)].to(D.device)

    # -- tables -----------------------------------------------------------------
    def _row_tables(self, b):
        """Each row's block table as a list of numpy int arrays."""
        if b.layout == batchkv.BatchLayout.PERSISTENT:
            blocks, at = b.delta_blocks, 0
            for slot, start, n, length, flags in b.table_deltas.tolist():
                if flags & 1:  # BKV_TABLE_OPENED: forget the slot's old table
                    self.tables[slot] = np.zeros(0, np.int32)
                t = self.tables.get(slot, np.zeros(0, np.int32))
                if start + n > len(t):
                    t = np.concatenate([t, np.zeros(start + n - len(t), np.int32)])
                t[start:start + n] = blocks[at:at + n]
                self.tables[slot] = t[:length].copy()
                at += n
                self.counts["deltas"] += 1
            rows = []
            g0 = b.groups[0]
            for slot in b.row_slot.tolist():
                t = self.tables[slot]
                assert not self.checks or np.array_equal(t, g0.row_table(slot)), \
                    "mirrored table differs"
                rows.append(t)
            return rows
        kvp, kvi = b.kv_indptr, b.kv_indices
        return [np.array(kvi[kvp[r]:kvp[r + 1]]) for r in range(b.n_rows)]

    # -- the host call ----------------------------------------------------------
    def forward(self, b, next_tokens):
        m = self.m
        sync = m.device.type == "cuda" and self.call_log is not None
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        self._copy(b.swap_out, self.kv_k, self.host_k)
        self._copy(b.swap_out, self.kv_v, self.host_v)
        self._copy(b.swap_in, self.host_k, self.kv_k)
        self._copy(b.swap_in, self.host_v, self.kv_v)
        self._copy(b.copies, self.kv_k, self.kv_k)
        self._copy(b.copies, self.kv_v, self.kv_v)
        self.counts["calls"] += 1
        if self.virtual_clock is not None:
            self.virtual_clock += 100 + 10 * b.n_tokens
        for f in ("copies", "swap_out", "swap_in"):
            self.counts[f] += len(getattr(b, f))
        tables = self._row_tables(b)
        qo = np.array(b.qo_indptr)
        tok, pos, slots = np.array(b.token_ids), np.array(b.positions), np.array(b.slot_mapping)
        drafts = np.array(b.row_drafts) if b.n_spec_rows else np.zeros(b.n_rows, np.uint32)
        self.counts["spec_rows"] += int(b.n_spec_rows)
        users, sample_row, branch = b.users, np.array(b.row_sample), np.array(b.row_branch)
        lpl = np.array(b.kv_last_page_len)
        bt = self.bt
        for r in range(b.n_rows if self.checks else 0):
            last = int(pos[qo[r + 1] - 1])
            assert int(lpl[r]) == last % bt + 1
            assert len(tables[r]) == last // bt + 1, "table length vs positions"
            for i in range(qo[r], qo[r + 1]):
                assert slots[i] == tables[r][pos[i] // bt] * bt + pos[i] % bt, "slot_mapping"
        with torch.no_grad():
            if self.mode == "exact":
                xs = self._exact(b, tables, qo, tok, pos, slots)
            else:
                xs = self._batched(b, tables, qo, tok, pos, slots)
            spec = b.spec_tokens if b.n_spec_rows else None
            if self.mode != "exact":  # one LM-head product and one transfer for the batch
                want = [(r, i) for r in range(b.n_rows) if sample_row[r]
                        for i in (range(qo[r], qo[r + 1]) if drafts[r] else (qo[r + 1] - 1,))]
                if want:
                    at = torch.as_tensor([i for _, i in want], device=m.device)
                    lg = m.logits(xs[at])
                    top = lg.argmax(-1).tolist()
                    for (r, i), lgi, t in zip(want, lg, top):
                        job = users[r]
                        if job.n != 1:
                            t = sample(lgi, job.n, job.seed, int(branch[r]), int(pos[i]) + 1)
                        if drafts[r]:
                            spec[i] = t
                        else:
                            next_tokens[r] = t
                sample_row = np.zeros_like(sample_row)  # done
            for r in range(b.n_rows):
                if not sample_row[r]:
                    continue
                job = users[r]
                if drafts[r]:  # the token sampled after each of the row's tokens
                    for i in range(qo[r], qo[r + 1]):
                        spec[i] = sample(m.logits(xs[i]), job.n, job.seed, int(branch[r]),
                                         int(pos[i]) + 1)
                else:
                    i = qo[r + 1] - 1
                    next_tokens[r] = sample(m.logits(xs[i]), job.n, job.seed, int(branch[r]),
                                            int(pos[i]) + 1)
        if sync:
            torch.cuda.synchronize()
        if self.call_log is not None:
            nd = b.n_decode_rows
            ctx = int(sum(int(pos[qo[r + 1] - 1]) + 1 for r in range(nd)))
            chunks = tuple((int(qo[r + 1] - qo[r]), int(pos[qo[r]])) for r in range(nd, b.n_rows))
            self.call_log.append((nd, ctx, chunks, int(drafts.sum()),
                                  time.perf_counter() - t0))

    def _exact(self, b, tables, qo, tok, pos, slots):
        """Hidden rows of every token, one position at a time (see the module doc)."""
        m, bt = self.m, self.bt
        xs = {}
        for r in range(b.n_rows):
            blocks = torch.as_tensor(tables[r].astype(np.int64), device=m.device)
            for i in range(qo[r], qo[r + 1]):
                p, slot = int(pos[i]), int(slots[i])
                ctx = torch.arange(p + 1, device=m.device)
                cb, co = blocks[ctx // bt], ctx % bt

                def write(l, k, v, blk=slot // bt, off=slot % bt):
                    self.kv_k[l][blk, off], self.kv_v[l][blk, off] = k, v

                def read(l, cb=cb, co=co):
                    return self.kv_k[l][cb, co], self.kv_v[l][cb, co]

                xs[i] = m.token(int(tok[i]), p, write, read)
        return xs

    def _batched(self, b, tables, qo, tok, pos, slots):
        """Hidden rows of every token, the batch at once (rounding differs from
        the exact path)."""
        m, bt, dev = self.m, self.bt, self.m.device
        hd, H, KH = m.head_dim, m.n_heads, m.n_kv_heads
        n = b.n_tokens
        t_tok = torch.as_tensor(tok.astype(np.int64), device=dev)
        t_pos = torch.as_tensor(pos.astype(np.int64), device=dev)
        t_slot = torch.as_tensor(slots.astype(np.int64), device=dev)
        rows = list(range(b.n_rows))
        # every row's context slots, padded: [rows, max_ctx] and a mask per token
        lens = [int(pos[qo[r + 1] - 1]) + 1 for r in rows]
        maxc = max(lens) if lens else 0
        idx = np.zeros((b.n_rows, maxc), np.int64)
        for r in rows:
            c = np.arange(lens[r])
            idx[r, :lens[r]] = tables[r][c // bt].astype(np.int64) * bt + c % bt
        t_idx = torch.as_tensor(idx, device=dev)
        row_of = torch.as_tensor(np.repeat(np.arange(b.n_rows), np.diff(qo)), device=dev)
        x = m.embed[t_tok]
        scale = 1.0 / float(np.sqrt(hd))
        for l, L in enumerate(m.L):
            h = m._norm(x, L["attn_norm"])
            q = m._rope((h @ L["wq"]).view(n, H, hd), t_pos)
            k = m._rope((h @ L["wk"]).view(n, KH, hd), t_pos)
            v = (h @ L["wv"]).view(n, KH, hd)
            ck = self.kv_k[l].view(-1, KH, hd)
            cv = self.kv_v[l].view(-1, KH, hd)
            ck[t_slot], cv[t_slot] = k, v
            out = torch.empty(n, H, hd, device=dev, dtype=m.dtype)
            nd = b.n_decode_rows
            nq_dec = int(qo[nd])
            if nq_dec:  # decode rows (with any drafts): a padded gather
                Kd = ck[t_idx[row_of[:nq_dec]]]  # [tokens, maxc, KH, hd]
                Vd = cv[t_idx[row_of[:nq_dec]]]
                cpos = torch.arange(maxc, device=dev)
                mask = cpos[None, :] <= t_pos[:nq_dec, None]
                qg = q[:nq_dec].view(nq_dec, KH, H // KH, hd)  # query heads by KV head
                s = torch.einsum("tckd,tkgd->tkgc", Kd, qg) * scale
                s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
                out[:nq_dec] = torch.einsum("tkgc,tckd->tkgd", torch.softmax(s, -1),
                                            Vd).reshape(nq_dec, H, hd)
            for r in range(nd, b.n_rows):  # prefill chunks: causal SDPA per row
                a, e = int(qo[r]), int(qo[r + 1])
                c = lens[r]
                Kr = ck[t_idx[r, :c]][:, m.group, :].transpose(0, 1)  # [H, c, hd]
                Vr = cv[t_idx[r, :c]][:, m.group, :].transpose(0, 1)
                qr = q[a:e].transpose(0, 1)                         # [H, e-a, hd]
                mask = torch.arange(c, device=dev)[None, :] <= t_pos[a:e, None]
                out[a:e] = _attention(qr, Kr, Vr, mask).transpose(0, 1)
            x = x + out.reshape(n, H * hd) @ L["wo"]
            h = m._norm(x, L["mlp_norm"])
            x = x + (torch.nn.functional.silu(h @ L["gate"]) * (h @ L["up"])) @ L["down"]
        return x

    # -- speculation: the model's first layers as the draft model ---------------
    def draft(self, req, branch, context, k, job):
        """Up to min(k, draft_k) greedy tokens of the draft model (the first
        draft_layers layers) after context, over a per-branch contiguous
        draft cache that keeps the longest common prefix from the last call."""
        m = self.m
        k = min(int(k), self.draft_k)
        ctx = [int(t) for t in context]
        total = len(ctx) + k
        key = (req, branch)
        toks, K, V = self._drafts.get(key, ([], None, None))
        if K is None or K.shape[1] < total:
            size = max(total * 2, 16)
            K2 = torch.zeros(self.draft_layers, size, m.n_kv_heads, m.head_dim,
                             device=m.device, dtype=m.dtype)
            V2 = torch.zeros_like(K2)
            if K is not None:
                K2[:, :K.shape[1]], V2[:, :V.shape[1]] = K, V
            K, V = K2, V2
        c = 0
        while c < min(len(toks), len(ctx)) and toks[c] == ctx[c]:
            c += 1
        c = min(c, len(ctx) - 1)  # recompute at least the last token (its hidden row)
        out = []
        with torch.no_grad():
            seq = ctx[:]
            p = c
            while True:
                def write(l, kk, vv, p=p):
                    K[l, p], V[l, p] = kk, vv

                x = m.token(seq[p], p, write, lambda l, p=p: (K[l, :p + 1], V[l, :p + 1]),
                            layers=self.draft_layers)
                if p == len(seq) - 1:
                    if len(out) == k:
                        break
                    t = int(torch.argmax(m.logits(x)))
                    out.append(t)
                    seq.append(t)
                    if len(out) == k:
                        break
                p += 1
        self._drafts[key] = (seq[:len(seq) - 1] if out else seq, K, V)
        self.counts["drafts"] += 1
        return out

    # -- the clock ----------------------------------------------------------------
    def now_us(self):
        """A virtual clock when virtual_clock is set (serve() sets it): it
        moves only by what the host calls cost (100 us a call, 10 a token),
        so the scheduler's time-based choices, and so the whole run, repeat
        exactly; else the real monotonic clock."""
        if self.virtual_clock is None:
            return time.monotonic_ns() // 1000
        return self.virtual_clock

    # -- notifications ------------------------------------------------------------
    def on_token(self, req, branch, token, job):
        job.got[branch].append(token)

    def on_finish(self, req, reason, job):
        job.finished += 1
        for key in [key for key in self._drafts if key[0] == req]:
            del self._drafts[key]


def workload(m, n_jobs=40, block_tokens=4, seed=3, max_new=(6, 14)):
    """Jobs sharing three system prompts (prefix hits), every 4th with n = 2
    (forks), every 5th with a stop token; references computed."""
    rng = np.random.default_rng(seed)
    systems = [[int(t) for t in rng.integers(0, m.vocab, 2 * block_tokens + 1 + s)]
               for s in range(3)]
    jobs = []
    for j in range(n_jobs):
        prompt = systems[j % 3] + [int(t) for t in rng.integers(0, m.vocab, 1 + j % 5)]
        n = 2 if j % 4 == 3 else 1
        stop = (int(rng.integers(0, m.vocab)),) if j % 5 == 0 else ()
        jobs.append(Job(prompt, int(max_new[0] + j % (max_new[1] - max_new[0] + 1)), stop, n,
                        seed=1000 + j))
    for job in jobs:
        job.ref = ref_generate(m, job.prompt, job.max_new, job.stop, job.n, job.seed)
    return jobs


def serve(m, jobs, layout, spec=0, block_tokens=4, device_blocks=20, host_blocks=256,
          max_running=8, mode="exact", draft_layers=None):
    """Serve jobs through a fresh pool and scheduler; returns (stats, host)."""
    for j in jobs:
        j.got = [[] for _ in range(j.n)]
        j.finished = 0
    host = TorchHost(m, block_tokens, device_blocks, host_blocks, mode=mode,
                     draft_layers=draft_layers, draft_k=max(spec, 1))
    host.virtual_clock = 1  # the run repeats exactly (see TorchHost.now_us)
    pool = batchkv.Pool(block_tokens=block_tokens, device_blocks=device_blocks,
                        host_blocks=host_blocks)
    kw = dict(max_running=max_running, preempt=batchkv.Preempt.SWAP, batch_layout=layout)
    if spec:
        kw.update(spec_max_k=spec, spec_k_mode=1, spec_drafts=1)
    s = batchkv.Scheduler(pool, host, **kw)
    for j in jobs:
        j.req = s.submit(j.prompt, j.max_new, stop_tokens=j.stop, n=j.n, user=j)
    steps = 0
    while s.pending:
        s.step()
        steps += 1
        assert steps < 20000, "stuck"
        assert s.check() == 0
    st = s.stats()
    s.close()
    pool.close()
    return st, host


def mismatches(jobs):
    """The jobs whose served tokens differ from the reference (or that did not end once)."""
    return [j for j in jobs if j.finished != 1 or j.got != j.ref]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (cuda when available)")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--device-blocks", type=int, default=20)
    ap.add_argument("--spec-k", type=int, default=3)
    ap.add_argument("--draft-layers", type=int, default=None,
                    help="the draft model's layers (default: half the model's)")
    args = ap.parse_args(argv)
    dev = args.device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        print("torch_host: no CUDA device; running on the CPU")
        dev = "cpu"
    if dev == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(0)
    m = Llama(device=dev)
    t0 = time.perf_counter()
    jobs = workload(m, n_jobs=args.requests)
    print("torch_host: %d requests (%d tokens of reference) on %s, %.1f s" %
          (len(jobs), sum(len(o) for j in jobs for o in j.ref), dev, time.perf_counter() - t0))
    ok = True
    for layout in (batchkv.BatchLayout.FLAT, batchkv.BatchLayout.PERSISTENT):
        for spec in (0, args.spec_k):
            t0 = time.perf_counter()
            st, host = serve(m, jobs, layout, spec, device_blocks=args.device_blocks,
                             draft_layers=args.draft_layers)
            bad = mismatches(jobs)
            ok = ok and not bad
            print("  %-10s spec_k=%d: %s  hits=%d cow=%d swaps=%d preempt=%d spec_accepted=%d "
                  "drafts=%d deltas=%d  %.1f s" %
                  (layout.name.lower(), spec,
                   "token-exact" if not bad else "%d MISMATCHED" % len(bad),
                   st.hit_tokens, host.counts["copies"], st.swaps, st.preemptions,
                   st.spec_accepted, host.counts["drafts"], host.counts["deltas"],
                   time.perf_counter() - t0))
            for j in bad[:3]:
                print("    request %d: served %s, alone %s" % (j.req, j.got, j.ref))
    print("torch_host: %s" % ("every token matches the reference" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
