"""Correctness on the GPU: the kernels against float64 on fresh random inputs, outputs poisoned first (NaN
never passes): the paged decode kernel (paged and contiguous layouts, split-K, GQA groups of 4 and 3), the
fused decode-step kernels and the skinny GEMM, flash and naive prefill."""
from __future__ import annotations

import random

import torch

from optladder.engine.attention import AttnMeta, FusedAttention, NaiveAttention
from optladder.engine.kernels import fused
from optladder.engine.kernels.gemv import skinny_linear
from optladder.engine.kernels.paged_decode import paged_decode_attention
from optladder.engine.kernels.reference import attention_reference, paged_decode_reference, rel_error
from gpubench.harness import BF16, DEV, TOL, poison_allocator


def check_paged_decode() -> list[dict]:
    rows = []
    cases = [  # name, batch, heads, kv_heads, head_dim, block_size, max_len, splits, dtype
        ("8B-shape paged, batch 1, split-K", 1, 32, 8, 128, 16, 2048, None, BF16),
        ("8B-shape paged, batch 8, split-K", 8, 32, 8, 128, 16, 1024, None, BF16),
        ("8B-shape paged, batch 33, no split", 33, 32, 8, 128, 16, 1024, None, BF16),
        ("8B-shape paged, fp16, 5 splits", 4, 32, 8, 128, 16, 777, 5, torch.float16),
        ("8B-shape contiguous (block = max_model_len)", 4, 32, 8, 128, 2048, 2048, None, BF16),
        ("SmolLM2-shape (group 3, head_dim 64)", 6, 9, 3, 64, 16, 300, None, BF16),
        ("head_dim 256, block 32", 3, 16, 2, 256, 32, 500, None, BF16),
        ("head_dim 96 (no power of 2), MHA", 3, 8, 8, 96, 16, 200, 2, BF16),
    ]
    for name, b, h, kvh, d, bs, max_len, splits, dt in cases:
        for trial in range(2):  # fresh inputs per check
            g = torch.Generator(device=DEV).manual_seed(random.randrange(1 << 30))
            per = -(-max_len // bs)
            nb = b * per + 3
            q = torch.randn(b, h, d, device=DEV, generator=g).to(dt)
            kc = torch.randn(nb, bs, kvh, d, device=DEV, generator=g).to(dt)
            vc = torch.randn(nb, bs, kvh, d, device=DEV, generator=g).to(dt)
            bt = torch.randperm(nb, device=DEV, generator=g)[:b * per].view(b, per).int()
            ctx = torch.randint(1, max_len + 1, (b,), device=DEV, generator=g).int()
            ctx[0] = max_len
            out = torch.full_like(q, float("nan"))
            paged_decode_attention(q, kc, vc, bt, ctx, out=out, splits=splits)
            err = rel_error(out, paged_decode_reference(q, kc, vc, bt, ctx))
            rows.append({"check": f"paged decode: {name}", "trial": trial, "rel_err": err, "ok": err <= TOL})
    return rows


def check_fused() -> list[dict]:
    rows = []
    g = torch.Generator(device=DEV).manual_seed(random.randrange(1 << 30))
    rnd = lambda *s: torch.randn(*s, device=DEV, generator=g).to(BF16)  # noqa: E731
    for t, hidden in ((1, 4096), (64, 4096), (7, 576)):
        x, r, w = rnd(t, hidden), rnd(t, hidden), rnd(hidden)
        poison_allocator()
        y, r_out = fused.add_rmsnorm(x, r, w, 1e-5)
        s = x.double() + r.double()
        ref = w.double() * s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5)
        rows.append({"check": f"add_rmsnorm [{t}, {hidden}]", "rel_err": max(rel_error(y, ref), rel_error(r_out, s))})
        gu = rnd(t, 2 * hidden)
        poison_allocator()
        got = fused.silu_mul(gu)
        gd, ud = gu.double().chunk(2, dim=-1)
        rows.append({"check": f"silu_mul [{t}, {hidden}]", "rel_err": rel_error(got, torch.nn.functional.silu(gd) * ud)})
    for t, nh, nkv, hd in ((1, 32, 8, 128), (40, 32, 8, 128), (9, 9, 3, 64)):
        qkv = rnd(t, (nh + 2 * nkv) * hd)
        pos = torch.randint(0, 8192, (t,), device=DEV)
        slots = torch.randperm(64 * 16, device=DEV)[:t]
        kc = torch.full((64, 16, nkv, hd), float("nan"), dtype=BF16, device=DEV)
        vc = torch.full_like(kc, float("nan"))
        inv = 1.0 / 500000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64, device=DEV) / hd)
        ang = torch.outer(torch.arange(8192, dtype=torch.float64, device=DEV), inv)
        emb = torch.cat([ang, ang], -1)
        poison_allocator()
        q = fused.rope_store_kv(qkv, pos, emb.cos().float(), emb.sin().float(), slots, kc, vc, nh, nkv, hd)
        c, s = emb.cos()[pos][:, None], emb.sin()[pos][:, None]
        qd, kd, vd = qkv.double().split([nh * hd, nkv * hd, nkv * hd], -1)

        def rope(x):
            x1, x2 = x.chunk(2, -1)
            return x * c + torch.cat([-x2, x1], -1) * s

        qr, kr = rope(qd.view(t, nh, hd)), rope(kd.view(t, nkv, hd))
        err = max(rel_error(q, qr), rel_error(kc.view(-1, nkv, hd)[slots], kr),
                  rel_error(vc.view(-1, nkv, hd)[slots], vd.view(t, nkv, hd)))
        rows.append({"check": f"rope_store_kv T={t} heads {nh}/{nkv} hd {hd}", "rel_err": err})
    for m in (1, 5, 16):
        for n, k, silu in ((6144, 4096, False), (4096, 14336, False), (2 * 14336, 4096, True), (960, 576, False),
                           (2 * 1536, 576, True)):
            x, w = rnd(m, k), rnd(n, k) * 0.02
            poison_allocator()
            got = skinny_linear(x, w, silu_mul=silu)
            ref = x.double() @ w.double().T
            if silu:
                gd, ud = ref.chunk(2, dim=-1)
                ref = torch.nn.functional.silu(gd) * ud
            rows.append({"check": f"skinny GEMM{' + SiLU·mul' if silu else ''} M={m} N={n} K={k}",
                         "rel_err": rel_error(got, ref)})
    for r in rows:
        r["ok"] = r["rel_err"] <= TOL
    return rows


def check_prefill() -> list[dict]:
    rows = []
    for flash in (True, False):
        for lens, ctxs, h, kvh, d in (([1000], [1000], 32, 8, 128), ([300, 77], [300, 77], 9, 3, 64),
                                      ([64], [320], 32, 8, 128)):  # last: a prefix-cache hit, 256 cached
            backend = FusedAttention(DEV, h, kvh) if flash else NaiveAttention()
            g = torch.Generator(device=DEV).manual_seed(random.randrange(1 << 30))
            tq = sum(lens)
            q = torch.randn(tq, h, d, device=DEV, generator=g).to(BF16)
            k = torch.randn(tq, kvh, d, device=DEV, generator=g).to(BF16)
            v = torch.randn(tq, kvh, d, device=DEV, generator=g).to(BF16)
            bs = 16
            per = [-(-c // bs) for c in ctxs]
            kc = torch.randn(sum(per) + 1, bs, kvh, d, device=DEV, generator=g).to(BF16)
            vc = torch.randn_like(kc)
            tables, slots, start = [], [], 0
            for i, (ql, c) in enumerate(zip(lens, ctxs)):
                blocks = list(range(sum(per[:i]), sum(per[:i + 1])))
                tables.append(blocks + [0] * (max(per) - len(blocks)))
                slots += [blocks[p // bs] * bs + p % bs for p in range(c - ql, c)]
            slots_t = torch.tensor(slots, device=DEV)
            kc.view(-1, kvh, d)[slots_t], vc.view(-1, kvh, d)[slots_t] = k, v  # what store_kv does first
            meta = AttnMeta(True, slots_t, torch.tensor(tables, dtype=torch.int32, device=DEV),
                            torch.tensor(ctxs, device=DEV), max(ctxs), lens, ctxs)
            if hasattr(backend, "plan"):  # the Triton varlen kernel's tiles, as the model runner plans them
                backend.plan(meta)
            poison_allocator()
            out = backend.prefill(q, k, v, meta, kc, vc)
            refs, start = [], 0
            for i, (ql, c) in enumerate(zip(lens, ctxs)):
                pos = torch.arange(c, device=DEV)
                blocks = meta.block_tables[i, pos // bs].long()
                refs.append(attention_reference(q[start:start + ql], kc[blocks, pos % bs], vc[blocks, pos % bs], True))
                start += ql
            err = rel_error(out, torch.cat(refs))
            rows.append({"check": f"prefill {backend.name}: q {lens} ctx {ctxs}, heads {h}/{kvh}, hd {d}",
                         "rel_err": err, "ok": err <= TOL})
    return rows
