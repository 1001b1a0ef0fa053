"""Fused ops for the h3batch DiT: AdaLN modulation (spec h3-model.md §5), QK RMSNorm + RoPE and SwiGLU (§4.3);
Triton kernels beside torch references.

Every modulation op takes `precision=None | "generic" | "sm90_bf16_affine"`; every op takes `backend=None | "triton" |
"torch"` (None = env var H3BATCH_MODULATION_PRECISION / H3BATCH_KERNEL_BACKEND, else automatic). See docs/kernels.md.
`qk_norm_rope` and `swiglu` have one semantics, the model's eager one (each bf16 op rounds).

Written here rather than reused: the public implementation (vllm-omni's `indexed_modulation.py`) imports vLLM, and
rounds with in-kernel bf16 casts that the Triton interpreter gets wrong, so its Hopper path cannot be tested on CPU.
"""
from h3batch.kernels.backend import Backend, Precision, is_sm90_device
from h3batch.kernels.gate import indexed_gate
from h3batch.kernels.gate_rms_norm_scale_shift import indexed_gate_rms_norm_scale_shift
from h3batch.kernels.qk_norm_rope import qk_norm_rope
from h3batch.kernels.rms_norm_scale_shift import rms_norm_indexed_scale_shift
from h3batch.kernels.scale_shift import indexed_scale_shift_
from h3batch.kernels.swiglu import swiglu

__all__ = [
    "Backend",
    "Precision",
    "indexed_gate",
    "indexed_gate_rms_norm_scale_shift",
    "indexed_scale_shift_",
    "is_sm90_device",
    "qk_norm_rope",
    "rms_norm_indexed_scale_shift",
    "swiglu",
]
