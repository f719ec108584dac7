# Sourced by the GPU scripts, with the folder for its log: `source benchmarks/gpu_site.sh "$OUT/<study>" || exit 1`.
# The wheelhouse (hydra, omegaconf, mlflow, ...; `python deploy/wheelhouse.py --out wheelhouse --extras ''
# --no-vllm-serve` here) installed once per machine into /tmp/site-optladder, which goes on PYTHONPATH.
_site_log=${1:?usage: source benchmarks/gpu_site.sh LOG_DIR}
if [ ! -d /tmp/site-optladder/hydra ] && [ -d wheelhouse ]; then
  ${PY:-python3} deploy/install.py --from wheelhouse --target /tmp/site-optladder > "$_site_log/install.log" 2>&1 \
    || { tail -20 "$_site_log/install.log"; return 1; }
fi
export PYTHONPATH=/tmp/site-optladder
