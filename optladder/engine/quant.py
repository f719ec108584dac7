"""Weight quantization at load time, gpt-fast style: every nn.Linear of the decoder layers is swapped for a
`QuantLinear` holding quantized weights and one scale per output channel (the row of W it scales).

`quant_int8` and `quant_fp8` are read once, in `quantize_model`, which the engine calls right after the
weights load. The embedding and lm_head (tied to it in SmolLM2) keep the model dtype, as vLLM's fp8 does:
the vocabulary projection is the layer most sensitive to rounding, and on Llama-3-8B it is 6% of the bytes.

- int8 (weight-only, CPU and GPU): q = round(W / s), s = max|row| / 127. The activations stay in the model
  dtype: decode batches of up to 64 rows on CUDA run the Triton kernel of optladder/engine/kernels/wq_gemv.py, which
  reads the int8 weight once; float32 decode rows on a CPU run the C kernel of optladder/engine/kernels/cpu_int8.py
  (built once with the host's C compiler), bfloat16 ones torch's int8 weight kernel (_weight_int8pack_mm);
  everything else dequantizes the weight to the model dtype and runs F.linear.
- fp8 (CUDA capability >= 8.9): q = fp8_e4m3(W / s), s = max|row| / 448. Decode batches of up to 64 rows run
  the same Triton kernel (fp8 weight, bf16 activations); larger batches (prefill) quantize the activations
  per token to E4M3 and run torch._scaled_mm with row-wise scales (per-tensor activation scales on 8.9).
Scales are float32: a bfloat16 scale would add up to 0.4% of error to a whole output channel.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from optladder.engine.kernels import cpu_int8

INT8_MAX = 127.0
FP8_MAX = 448.0  # largest finite float8_e4m3fn
SKINNY_MAX_M = 64  # CUDA: optladder/engine/kernels/wq_gemv.py up to this many rows, then the prefill path
CPU_INT8_MAX_M = 16  # CPU: an int8 kernel up to this many rows, then dequantize (a prefill's GEMM is compute-bound)
FP8_MIN_CAPABILITY = (8, 9)


@dataclass
class QuantReport:
    """Evidence for opts_effective: what was quantized, the bytes before and after, the kernels that ran."""

    method: str | None = None
    layers: int = 0
    weight_bytes_before: int = 0
    weight_bytes_after: int = 0
    kernels: dict[str, int] = field(default_factory=dict)  # kernel -> eager calls (a graph replay is not one)
    notes: list[str] = field(default_factory=list)  # why a faster kernel did not run

    def evidence(self) -> dict:
        out = {"on": self.method is not None, "method": self.method, "linear_layers": self.layers,
               "weight_bytes_before": self.weight_bytes_before, "weight_bytes_after": self.weight_bytes_after,
               "weight_bytes_ratio": round(self.weight_bytes_after / max(1, self.weight_bytes_before), 4),
               "kernels": dict(sorted(self.kernels.items()))}
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    def note(self, why: str) -> None:
        if why not in self.notes:
            self.notes.append(why)


def quantize_rows(weight: torch.Tensor, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (q [N, K] int8 or float8_e4m3fn, scales [N] float32) with W ≈ q * scales[:, None]."""
    w = weight.detach().float()
    qmax = INT8_MAX if method == "int8" else FP8_MAX
    scales = (w.abs().amax(dim=1) / qmax).clamp_min(1e-12)  # an all-zero row keeps scale > 0
    scaled = w / scales[:, None]
    if method == "int8":
        return scaled.round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scales
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scales


def dequantize_rows(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scales[:, None]).to(dtype)


class QuantLinear(nn.Module):
    """y = x · (q · s)ᵀ for a bias-free linear layer. The quantized weight is `qweight`, so code that reads
    `.weight` expecting a dense matrix fails loudly instead of multiplying by int8 codes."""

    def __init__(self, linear: nn.Linear, method: str, report: QuantReport):
        super().__init__()
        assert linear.bias is None, "the decoder's linear layers have no bias"
        q, scales = quantize_rows(linear.weight, method)
        self.register_buffer("qweight", q)
        self.register_buffer("scales", scales)
        self.method, self.report = method, report
        self.out_features, self.in_features = q.shape
        self.dtype = linear.weight.dtype

    def _count(self, kernel: str) -> None:
        self.report.kernels[kernel] = self.report.kernels.get(kernel, 0) + 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        m = rows.shape[0]
        if x.is_cuda and m <= SKINNY_MAX_M and x.dtype in (torch.bfloat16, torch.float16):
            from optladder.engine.kernels.wq_gemv import wq_linear

            self._count(f"triton_wq_gemv_{self.method}")
            out = wq_linear(rows, self.qweight, self.scales)
        elif self.method == "fp8" and x.is_cuda:
            self._count("scaled_mm_fp8")
            out = scaled_mm_fp8(rows, self.qweight, self.scales)
        elif self.method == "int8" and not x.is_cuda and x.dtype == torch.float32 and m <= CPU_INT8_MAX_M \
                and cpu_int8_ready(self.report):
            self._count("cpu_int8_gemm_c")
            out = cpu_int8.int8_linear(rows, self.qweight, self.scales)
        elif self.method == "int8" and not x.is_cuda and x.dtype == torch.bfloat16 and m <= CPU_INT8_MAX_M:
            # torch's CPU int8 kernel: fast for decode rows in bf16, far slower than dequantizing for prefill
            self._count("weight_int8pack_mm")
            out = torch._weight_int8pack_mm(rows, self.qweight, self.scales.to(x.dtype))
        else:
            self._count(f"dequant_linear_{self.method}")
            out = F.linear(rows, dequantize_rows(self.qweight, self.scales, x.dtype))
        return out.reshape(*x.shape[:-1], self.out_features)


def cpu_int8_ready(report: QuantReport) -> bool:
    """Whether the CPU int8 kernel (float32 decode rows) can run; if not, the report notes why."""
    if cpu_int8.kernel() is None:
        report.note(f"float32 decode rows dequantize: {cpu_int8.unavailable()}")
        return False
    return True


def scaled_mm_fp8(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] (bf16/fp16) · (qweight [N, K] fp8 · scales)ᵀ with x quantized to E4M3 per token.
    Row-wise scaling needs capability 9.0; on 8.9 the activation scale is per tensor and the weight's
    per-channel scale is applied after the product."""
    rowwise = not x.is_cuda or torch.cuda.get_device_capability(x.device) >= (9, 0)
    amax = x.abs().amax(dim=1, keepdim=True) if rowwise else x.abs().amax().reshape(1, 1)
    x_scale = (amax.float() / FP8_MAX).clamp_min(1e-12)
    xq = (x.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    out_dtype = x.dtype if x.is_cuda else torch.float32
    if rowwise:
        out = torch._scaled_mm(xq, qweight.t(), scale_a=x_scale, scale_b=scales[None, :].contiguous(),
                               out_dtype=out_dtype)
    else:
        one = torch.ones((), device=x.device)
        out = torch._scaled_mm(xq, qweight.t(), scale_a=x_scale.reshape(()), scale_b=one, out_dtype=torch.float32)
        out = out * scales[None, :]
    return out.to(x.dtype)


def model_weight_bytes(model: nn.Module) -> int:
    """Parameters (a tied weight once) and the quantized layers' weights and scales."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for mod in model.modules():
        if isinstance(mod, QuantLinear):
            total += sum(b.numel() * b.element_size() for b in (mod.qweight, mod.scales))
    return total


def quant_method(cfg) -> str | None:
    """The one place quant_int8 and quant_fp8 are read: 'int8', 'fp8' or None; both on is refused."""
    int8, fp8 = cfg.quant_int8, cfg.quant_fp8
    if int8 and fp8:
        raise ValueError("opts quant_int8 and quant_fp8 both quantize the weights: pick one "
                         "(+opt=quant_int8 or +opt=quant_fp8)")
    return "int8" if int8 else ("fp8" if fp8 else None)


def quantize_model(model: nn.Module, method: str | None) -> QuantReport:
    """Swap the decoder layers' nn.Linear modules for QuantLinear, in place, when a method is given."""
    report = QuantReport(method, weight_bytes_before=model_weight_bytes(model))
    if report.method is not None:
        for layer in model.layers:
            for name, mod in list(layer.named_children()):
                if isinstance(mod, nn.Linear):
                    setattr(layer, name, QuantLinear(mod, report.method, report))
                    report.layers += 1
        if next(model.parameters()).is_cuda:
            torch.cuda.empty_cache()  # the dense weights are gone: give their memory back to the KV budget
        elif report.method == "int8" and next(model.parameters()).dtype == torch.float32:
            cpu_int8_ready(report)  # build the CPU kernel now, not inside the first request's latency
    report.weight_bytes_after = model_weight_bytes(model)
    return report


def linear_dims(shape) -> tuple[int, ...]:
    """The in and out sizes of a decoder layer's linear layers (q/k/v and gate/up fused), from its shape."""
    heads = shape.num_attention_heads + 2 * shape.num_key_value_heads
    return (shape.hidden_size, heads * shape.head_dim, shape.num_attention_heads * shape.head_dim,
            2 * shape.intermediate_size, shape.intermediate_size)


def validate_quant(method: str | None, dtype: str, device: torch.device, dims: tuple[int, ...]) -> None:
    """Refuse, before the weights load, a quantization this machine or model cannot run.
    dtype: engine.dtype; dims: the in and out sizes of the decoder's linear layers."""
    if method != "fp8" or device.type != "cuda":
        return  # quant_fp8 off CUDA is refused with the other CUDA-only opts (optladder/engine/validation.py)
    cap = torch.cuda.get_device_capability(device)
    if cap < FP8_MIN_CAPABILITY:
        raise ValueError(f"opt quant_fp8 needs FP8 tensor cores (CUDA capability >= 8.9: Ada, Hopper or newer), "
                         f"but {torch.cuda.get_device_name(device)} has {cap[0]}.{cap[1]}: use +opt=quant_int8")
    if dtype == "float32":
        raise ValueError("opt quant_fp8 multiplies in bfloat16 or float16, not engine.dtype=float32: "
                         "set engine.dtype=bfloat16 (or auto)")
    bad = sorted({d for d in dims if d % 16})
    if bad:
        raise ValueError(f"opt quant_fp8: torch._scaled_mm needs layer sizes that are multiples of 16, this model "
                         f"has {bad}: use +opt=quant_int8")
