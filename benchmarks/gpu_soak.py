"""The soak on a GPU, in one device call and without Hydra, MLflow or locust (the GPU image has none of
them): the reference engine with every lossless switch on, behind its HTTP server, fed the builtin workload
in a loop for --minutes, 5% bad requests mixed in, the stdlib thread client; the gates of optladder/abtest/soak.py
(device memory slope included). Writes soak.json, soak.md, soak.png, requests.jsonl and bad_requests.jsonl
under --out. Run by benchmarks/gpu_soak.sh; on a CPU, `--device cpu --model tiny --minutes 1` checks it.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import yaml  # noqa: E402

from optladder.abtest.soak import SoakConfig  # noqa: E402
from optladder.backends.engines import ReferenceBackend  # noqa: E402
from optladder.engine.config import EngineConfig, ModelConfig  # noqa: E402
from optladder.experiments.soak_core import soak_replay  # noqa: E402
from optladder.traffic.request import Request  # noqa: E402
from optladder.traffic.workload import WorkloadConfig, build_workload  # noqa: E402


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--model", default="llama3_8b_shape", help="a optladder/conf/model/*.yaml name")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rate", type=float, default=8.0, help="requests per second of the workload")
    ap.add_argument("--num-requests", type=int, default=256, help="per pass of the loop")
    ap.add_argument("--bad-rate", type=float, default=0.05)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--kv-cache-gb", type=float, default=16.0)
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    fields = yaml.safe_load((ROOT / "optladder" / "conf" / "model" / f"{args.model}.yaml").read_text())
    model = ModelConfig(**fields)
    gpu = args.device == "cuda"
    engine_cfg = EngineConfig(device=args.device, max_model_len=args.max_model_len, kv_cache_gb=args.kv_cache_gb,
                              max_num_seqs=64, paged_kv=True, flash_attn=gpu, dynamic_batching=True,
                              batched_decode=True, cuda_graphs=gpu)
    t0 = time.perf_counter()
    backend = ReferenceBackend(model, engine_cfg)
    print(f"engine up in {time.perf_counter() - t0:.1f} s", flush=True)
    wcfg = WorkloadConfig(name="builtin", num_requests=args.num_requests, rate=args.rate,
                          input_len_range=[32, 1024], output_len_range=[16, 256])
    workload = build_workload(wcfg, backend.tokenizer, args.max_model_len, None)
    rng = random.Random(1)  # warm-up on unrelated token ids: graphs, kernels and the allocator, not the prompts
    backend.warmup([Request(f"warmup-{i}", [rng.randrange(1000, 30000) for _ in range(r.input_len)], 4)
                    for i, r in enumerate(workload.requests[:8])])
    short = args.minutes < 4  # a check on a CPU: smaller windows, so there are some
    cfg = SoakConfig(name=f"{args.device}-{args.model}", duration_min=args.minutes, window_s=10 if short else 60,
                     warmup_min=args.minutes / 4 if short else 1.0,
                     bad_request_rate=args.bad_rate, client="threads", max_p999_ratio=1.5)
    report = soak_replay(backend, workload.requests, cfg, args.out, model.name, timeout_s=600.0)
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0) if gpu else platform.processor(), "args": vars(args)}
    (args.out / "soak_env.json").write_text(json.dumps(env, indent=2, default=str))
    print((args.out / "soak.md").read_text())
    return 0 if report["verdict"] == "pass" else 1


if __name__ == "__main__":
    raise SystemExit(main())
