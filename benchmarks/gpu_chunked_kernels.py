"""The varlen attention kernel of chunked prefill (optladder/engine/kernels/paged_prefill.py) on a GPU: checked against
float64 with a poisoned output, then timed against what it replaces, side by side in one run.

Shapes: Llama-3-8B's attention (32 heads, 8 KV heads, head_dim 128), bf16, blocks of 16 tokens.
- fresh prompts (no cached context): the varlen kernel vs PyTorch's flash SDPA, one call per sequence
  (what the engine runs for such a step);
- a mixed step (a 2,048-token chunk after 2,048 cached tokens, and 128 decode rows of 1,000-3,000 tokens):
  the varlen kernel in one launch vs flash SDPA over the gathered context for the chunk plus the Triton
  decode kernel for the decode rows.
Times: triton.testing.do_bench medians (ms), fresh inputs per case.

    python3 benchmarks/gpu_chunked_kernels.py --out $OUT
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from optladder.engine.attention import gather_kv  # noqa: E402
from optladder.engine.kernels.paged_decode import paged_decode_attention  # noqa: E402
from optladder.engine.kernels.paged_prefill import block_q, paged_prefill_attention, tile_list  # noqa: E402
from optladder.engine.kernels.reference import paged_prefill_reference, rel_error  # noqa: E402

H, KVH, D, BS = 32, 8, 128, 16
DEV = torch.device("cuda")


def layout(rows: list[tuple[int, int]], gen: torch.Generator):
    """(query len, context len) per sequence -> q, caches, tables, starts, context lens, tiles."""
    q_lens, ctx = [r[0] for r in rows], [r[1] for r in rows]
    per_seq = [-(-c // BS) for c in ctx]
    n_blocks = sum(per_seq) + 1
    kc = torch.randn(n_blocks, BS, KVH, D, generator=gen).to(torch.bfloat16).to(DEV)
    vc = torch.randn(n_blocks, BS, KVH, D, generator=gen).to(torch.bfloat16).to(DEV)
    perm = torch.randperm(n_blocks, generator=gen).tolist()
    tables, used = torch.zeros(len(rows), max(per_seq), dtype=torch.int32), 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = torch.tensor(perm[used:used + n])
        used += n
    q = torch.randn(sum(q_lens), H, D, generator=gen).to(torch.bfloat16).to(DEV)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    tiles = torch.tensor(tile_list(q_lens, block_q(H, KVH)), dtype=torch.int32, device=DEV)
    return q, kc, vc, tables.to(DEV), starts, torch.tensor(ctx, device=DEV), tiles, q_lens, ctx


def flash(q, k, v, causal_offset: int | None):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    q, k, v = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    backends = [SDPBackend.FLASH_ATTENTION] if causal_offset is None else \
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    with sdpa_kernel(backends):
        if causal_offset is None:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        mask = causal_lower_right(q.shape[2], k.shape[2])
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def main() -> int:
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu_out"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "checks": {}, "times_ms": {}}
    mixed = [(2048, 4096)] + [(1, 1000 + 16 * i) for i in range(128)]
    cases = {"mixed_chunk2048_after2048_plus128decodes": mixed, "fresh_1x4096": [(4096, 4096)],
             "fresh_8x512": [(512, 512)] * 8}
    for name, rows in cases.items():
        q, kc, vc, bt, starts, ctx, tiles, q_lens, ctx_l = layout(rows, gen)
        out = torch.full_like(q, float("nan"))
        paged_prefill_attention(q, kc, vc, bt, starts, ctx, tiles, out=out)
        torch.cuda.synchronize()
        if name.startswith("mixed") or name == "fresh_8x512":  # the float64 reference is slow at 4,096
            res["checks"][name] = rel_error(out, paged_prefill_reference(q, kc, vc, bt, q_lens, ctx_l))
        t_var = triton.testing.do_bench(lambda: paged_prefill_attention(q, kc, vc, bt, starts, ctx, tiles),
                                        return_mode="median")
        if name.startswith("fresh"):
            ks = [gather_kv(kc, bt[i:i + 1], c)[0] for i, c in enumerate(ctx_l)]
            vs = [gather_kv(vc, bt[i:i + 1], c)[0] for i, c in enumerate(ctx_l)]
            qs = q.split(q_lens)

            def per_seq():
                for i in range(len(q_lens)):
                    flash(qs[i], ks[i], vs[i], None)
            t_ref = triton.testing.do_bench(per_seq, return_mode="median")
            ref_name = "flash SDPA per sequence (K/V already contiguous)"
        else:
            dq = q[2048:]

            def split():
                k = gather_kv(kc, bt[:1], ctx_l[0])[0]
                v = gather_kv(vc, bt[:1], ctx_l[0])[0]
                flash(q[:2048], k, v, causal_offset=ctx_l[0] - 2048)
                paged_decode_attention(dq, kc, vc, bt[1:], ctx[1:].to(torch.int32))
            t_ref = triton.testing.do_bench(split, return_mode="median")
            ref_name = "gather + SDPA for the chunk, Triton decode kernel for the decode rows"
        res["times_ms"][name] = {"varlen_kernel": round(t_var, 4), "reference": round(t_ref, 4),
                                 "reference_is": ref_name}
        print(name, res["times_ms"][name], res["checks"].get(name), flush=True)
    (args.out / "gpu_chunked_kernels.json").write_text(json.dumps(res, indent=1))
    ok = all(v <= 1e-2 for v in res["checks"].values())
    print("checks", "ok" if ok else "FAILED", res["checks"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
