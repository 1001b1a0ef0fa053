"""The DiT's serving precision, H3BATCH_PRECISION: `bf16` (default, the release's semantics, nothing changed) or
`fp8` (opt-in, issue 25).

`fp8` replaces, once at load, the five token-wise linears of each of the 50 DiT blocks (`attn.qkv_proj`,
`attn.to_gate_compress`, `attn.out_proj`, `mlp.fc1`, `mlp.fc2`: about 98 % of the DiT's FLOPs) with `Fp8Linear`:
e4m3 weights with one fp32 scale per output row, activations quantized per row at each call
(kernels/fp8_linear.py). Everything else stays as loaded: the AdaLN projections (M = 1: no GEMM to speed up, and
every row's modulation hangs on them), the text refiner (128 rows), the patch projections, the time MLP, the norms,
attention and the fp32 output heads. The bf16 weights of a replaced linear are freed, so the fp8 DiT holds about
half the bytes for those layers.

On CUDA below compute capability 8.9 there is no e4m3 GEMM: `fp8` is refused at load naming the setting. On the
CPU `fp8` runs the fake-quant reference (the same quantization, an fp32 product of the dequantized operands), which
is what the tiny-size tests measure. Measured error at the output: docs/performance.md "FP8 precision".
"""
from __future__ import annotations

import torch
import torch.nn as nn

from h3batch.kernels.fp8_linear import fp8_linear, reference_quantize_rows, scaled_mm_supported

SETTING = "H3BATCH_PRECISION"
PRECISIONS = ("bf16", "fp8")
DEFAULT = "bf16"
FP8_LINEARS = ("attn.qkv_proj", "attn.to_gate_compress", "attn.out_proj", "mlp.fc1", "mlp.fc2")
"""The linears of one DiTBlock that `fp8` quantizes (paths below the block)."""


class Fp8Linear(nn.Module):
    """A frozen linear with an e4m3 weight [N, K] and fp32 row scales [N, 1] (buffers: they load and move with the
    module, are counted by memory plans, and are never trained)."""

    def __init__(self, weight_fp8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = weight_fp8.shape[1], weight_fp8.shape[0]
        self.register_buffer("weight_fp8", weight_fp8)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        with torch.no_grad():
            q, scale = reference_quantize_rows(linear.weight)
            bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, scale, bias)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.weight_fp8.float() * self.weight_scale).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight_fp8, self.weight_scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, e4m3 row-scaled"


def check_precision(precision: object) -> str:
    """The precision name, or ValueError naming H3BATCH_PRECISION and the choices."""
    if not isinstance(precision, str) or precision.strip().lower() not in PRECISIONS:
        raise ValueError(f"{SETTING}: expected one of {list(PRECISIONS)}, got {precision!r}")
    return precision.strip().lower()


def check_device(precision: str, device: torch.device) -> None:
    """fp8 needs an e4m3 GEMM on CUDA (sm_89+); the CPU runs the reference. ValueError names the setting."""
    if precision == "fp8" and device.type == "cuda" and not scaled_mm_supported(device):
        major, minor = torch.cuda.get_device_capability(device)
        raise ValueError(f"{SETTING}=fp8 needs a GPU of compute capability >= 8.9 (e4m3 GEMMs); "
                         f"{device} is {major}.{minor}: use bf16")


def apply_precision(dit: nn.Module, precision: str) -> nn.Module:
    """Put `dit` (an H3Transformer) in `precision`, in place, and return it. `bf16` changes nothing."""
    precision = check_precision(precision)
    if precision == "bf16":
        return dit
    device = next(dit.parameters()).device
    check_device(precision, device)
    for block in dit.blocks:
        quantize_block_(block)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    dit.precision = precision
    return dit


def quantize_block_(block: nn.Module) -> nn.Module:
    """Replace the `FP8_LINEARS` of one DiTBlock by `Fp8Linear`s, in place (absent or already replaced: skipped)."""
    for path in FP8_LINEARS:
        parent_path, _, name = path.rpartition(".")
        parent = block.get_submodule(parent_path)
        linear = getattr(parent, name)
        if isinstance(linear, nn.Linear):
            setattr(parent, name, Fp8Linear.from_linear(linear))
            del linear  # the bf16 weight goes with the last reference
    return block


def precision_of(dit: nn.Module) -> str:
    """The precision `apply_precision` left on `dit` (bf16 when never applied)."""
    return getattr(dit, "precision", DEFAULT)
