"""Is a candidate lossless against its control? Only when every difference between the two resolved
configs is a lossless opt (engine/opts.py) or a scheduling knob that changes when tokens are computed,
never what they are. Then the gates also demand the control's exact outputs."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from engine.opts import OPTS
from experiments.tracking import flatten

SCHEDULING = {"engine.batch_size", "engine.batch_timeout_ms", "engine.max_num_seqs", "engine.max_num_batched_tokens",
              "engine.block_size", "engine.kv_cache_gb", "engine.kv_cache_memory_fraction"}
IGNORED = ("tracking.", "replay.progress", "ab.", "ladder.")


def arms_lossless(control: DictConfig, candidate: DictConfig) -> tuple[bool, str]:
    a = flatten(OmegaConf.to_container(control, resolve=True))
    b = flatten(OmegaConf.to_container(candidate, resolve=True))
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and not k.startswith(IGNORED))
    lossless_fields = {f"engine.{s.field}": s for s in OPTS.values()}
    lossy = [k for k in diff if k not in SCHEDULING and not (k in lossless_fields and lossless_fields[k].lossless)]
    if lossy:
        return False, f"lossy: {', '.join(f'{k}={a.get(k)}->{b.get(k)}' for k in lossy)}"
    return True, f"lossless: differs only in {', '.join(diff) or 'nothing'}"
