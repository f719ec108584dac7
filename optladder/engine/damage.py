"""A deliberately damaged model (`model.damage`), applied once the weights are loaded: the calibration case
that shows the quality gates fail a model that is really worse, next to the bfloat16 case that must pass.

- round_bits:<b>  every decoder linear weight rounded to b bits, symmetric, one scale per row (3 bits:
                  the levels -3..3 times max|row| / 3), kept in the model dtype;
- zero_layer:<i>  every linear weight of decoder layer i set to zero (the layer then adds nothing to the
                  residual stream: it is skipped).
The embedding and lm_head are left alone. Works on any module with a `layers` list of decoder layers.
"""
from __future__ import annotations

import torch
from torch import nn

KINDS = ("round_bits", "zero_layer")


def parse_damage(spec: str, num_layers: int) -> tuple[str, int]:
    kind, _, arg = spec.partition(":")
    if kind not in KINDS or not arg.isdigit():
        raise ValueError(f"model.damage={spec!r} is not one of {[k + ':<int>' for k in KINDS]} "
                         "(e.g. round_bits:3 or zero_layer:10), or null")
    n = int(arg)
    if kind == "round_bits" and not 2 <= n <= 8:
        raise ValueError(f"model.damage={spec!r}: round_bits takes 2 to 8 bits, got {n}")
    if kind == "zero_layer" and n >= num_layers:
        raise ValueError(f"model.damage={spec!r}: the model has layers 0..{num_layers - 1}")
    return kind, n


@torch.no_grad()
def damage_model(layers: nn.ModuleList, spec: str) -> int:
    """Damage the decoder layers in place; returns how many linear weights were changed."""
    kind, n = parse_damage(spec, len(layers))
    targets = layers[n:n + 1] if kind == "zero_layer" else layers
    changed = 0
    for layer in targets:
        for mod in layer.modules():
            if not isinstance(mod, nn.Linear):
                continue
            if kind == "zero_layer":
                mod.weight.zero_()
            else:
                w = mod.weight.float()
                qmax = 2 ** (n - 1) - 1
                scale = (w.abs().amax(dim=1, keepdim=True) / qmax).clamp_min(1e-12)
                mod.weight.copy_(((w / scale).round().clamp(-qmax, qmax) * scale).to(mod.weight.dtype))
            changed += 1
    return changed
