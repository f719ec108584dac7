#!/usr/bin/env bash
# The vLLM ladder on a GPU through run.py: `python run.py engine=vllm +ladder=vllm model=smollm2_135m
# workload=azure_conv` with vLLM 0.26.0 served from the offline bundle, SmolLM2-135M-Instruct's real weights in bf16,
# the Azure conversation trace's first N_LADDER (300) requests at TS_LADDER (0.25: 4x its rate), every rung in a
# switchback beside its control (BLOCKS 15, LOOKS 3: sequential stopping) gated on E2E p90 (p99 of 300 requests is
# not resolved), 4 GiB of KV per server (two run at once: with an exact KV size the launch asks vLLM's start-up
# check for 0.2 of the GPU free, optladder/backends/vllm_args.py), 200 quality prompts (near-tie check over vLLM's top-5 log-probs for the
# lossless rungs, teacher-forced gates over its top-20 prompt log-probs for kv_fp8 and quant_fp8).
# It is gpu_ab_vllm.sh with JOB=ladder: the same staging, detached run and packing (read its header).
#
# Here, once (ignored folders):
#   CAP_MIB=36 bash ../shared/tools/vllm-gpu/build.sh                         # .vllm-gpu/c1 c2 c3, manifest.tsv
#   python deploy/wheelhouse.py --out .vllm-serve-wheels --only-vllm-serve   # the wheels `vllm serve` needs more
#   python deploy/wheelhouse.py --out wheelhouse --extras '' --no-vllm-serve # ours
#   bash benchmarks/stage_smollm2.sh                                          # .stage/a b c: SmolLM2's GGUF
#   mkdir -p .gpu-data && cp -r ../shared/data/traces ../shared/data/prompts .gpu-data/
#   pip download --no-deps -d .stage/mei mlflow-export-import==1.2.0
#   PY=.venv/bin/python bash benchmarks/gpu_vllm_ladder.sh check              # every rung's vLLM command (CPU)
# Device calls back to back on one warm machine (each carries at most 64 MiB with the ~15 MiB tree):
#   1 stage  carry: .vllm-gpu/c1 .vllm-gpu/assemble.sh
#   2 stage  carry: .vllm-gpu/c2 .vllm-gpu/assemble.sh .gpu-data .stage/mei
#   3 stage  carry: .vllm-gpu/c3 .vllm-gpu/manifest.tsv .vllm-gpu/assemble.sh .vllm-serve-wheels
#   4 stage  carry: wheelhouse       5 stage  carry: .stage/a       6 stage  carry: .stage/b
#   7 start  carry: .stage/c         8... wait (exit 124 while it runs: call again at once)
# A ladder outlasts one machine (each rung starts two vLLM servers; a machine is held 30 minutes): each call packs
# the run so far into $OUT/ladder-vllm-<mode>.tgz; FROM=<its run folder, carried> resumes it on the next machine
# (ladder.resume_from: the rungs that finished are read back, with their controls run beside them). FROM must not
# be $STATE/run on the same machine: `start` clears that folder first; unpack the packed run elsewhere.
exec env JOB=ladder bash "$(dirname "$0")/gpu_ab_vllm.sh" "$@"
