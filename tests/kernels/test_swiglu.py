"""swiglu: Triton vs the model's eager ``silu(gate) * up`` (two bf16 roundings), layouts, checks, model wiring."""
from __future__ import annotations

import pytest
import torch

from h3batch.kernels import swiglu
from h3batch.kernels.swiglu import reference_swiglu
from h3batch.worker.h3.config import T2
from h3batch.worker.h3.model import SwiGLU
from tests.kernels.kernel_cases import CUDA, assert_matches


def _fc1_out(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    """fc1-like output of scale ~3 (silu's curved part and its tails both show up)."""
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(*shape, generator=g)).to(dtype).to(device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(2, 5, 320), (7, 3000), (1, 3, 2)], ids=["BSF_160", "RF_1500", "F_1"])
def test_triton_matches_eager_reference(device, shape, dtype):
    """The kernel equals eager silu(g) * u (fp32 1e-5; bf16 5e-2 with at most 0.1% of elements one ulp off),
    for F below, above and across the 1024-column program width."""
    fc1_out = _fc1_out(shape, dtype, device)
    out = swiglu(fc1_out, backend="triton")
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.is_contiguous()
    assert_matches(out, reference_swiglu(fc1_out), exact=False)


def test_rounds_silu_then_product(device):
    """bf16 output is bf16(bf16(silu(g)) * u), not the one-rounding bf16(silu(g) * u): on the elements where the
    two differ the kernel takes the twice-rounded value."""
    fc1_out = _fc1_out((64, 512), torch.bfloat16, device, seed=4)
    gate, up = (half.float().cpu() for half in fc1_out.chunk(2, dim=-1))
    silu = gate / (1 + torch.exp(-gate))
    twice = (silu.bfloat16().float() * up).bfloat16()
    once = (silu * up).bfloat16()
    differ = twice != once
    assert differ.sum() > 100  # the probe does separate the two semantics
    out = swiglu(fc1_out, backend="triton").cpu()
    assert torch.equal(out[differ], twice[differ])


def test_strided_rows(device):
    """A row-strided view (every other row, columns a prefix of a wider buffer) equals the contiguous copy."""
    wide = _fc1_out((2, 12, 700), torch.bfloat16, device, seed=5)
    view = wide[:, ::2, :600]
    assert not view.is_contiguous()
    assert torch.equal(swiglu(view, backend="triton"), swiglu(view.contiguous(), backend="triton"))
    assert_matches(swiglu(view, backend="triton"), reference_swiglu(view), exact=False)


@pytest.mark.parametrize("bad,message", [
    (torch.zeros(2, 3, 4, 8, dtype=torch.bfloat16), "2-D"),
    (torch.zeros(4, 7, dtype=torch.bfloat16), "2F"),
    (torch.zeros(4, 8, dtype=torch.float16), "dtype"),
    (torch.zeros(8, 4, dtype=torch.bfloat16).t(), "contiguous"),
])
def test_bad_input_raises(bad, message):
    """Wrong rank, an odd last dim, fp16 or strided columns raise ValueError naming what was expected."""
    with pytest.raises(ValueError, match=message):
        swiglu(bad, backend="torch")


def test_model_swiglu_uses_the_fused_op(device, monkeypatch):
    """h3batch.worker.h3.model.SwiGLU gives the same output with the Triton op as with the eager backend (T2, bf16)."""
    torch.manual_seed(3)
    mlp = SwiGLU(T2, torch.bfloat16).to(device)
    h = torch.randn(2, 7, T2.hidden_size, device=device).to(torch.bfloat16)
    outputs = {}
    with torch.no_grad():
        for backend in ("triton", "torch"):
            monkeypatch.setenv("H3BATCH_KERNEL_BACKEND", backend)
            outputs[backend] = mlp(h)
    assert_matches(outputs["triton"], outputs["torch"], exact=False)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device: real H3 width against eager CUDA torch")
def test_real_width_against_eager_cuda():
    """At F = 14336 the kernel (libdevice expf, IEEE division) matches eager CUDA torch's silu and product."""
    fc1_out = _fc1_out((512, 2 * 14336), torch.bfloat16, "cuda")
    out = swiglu(fc1_out, backend="triton")
    ref = reference_swiglu(fc1_out)
    print(f"swiglu real width: {(out != ref).float().mean().item():.2e} of elements differ from eager CUDA")
    assert_matches(out, ref, exact=False)
