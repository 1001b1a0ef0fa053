"""qk_norm_rope: Triton vs the model's eager QK RMSNorm + partial RoPE (bf16 roundings), layouts, checks, model wiring."""
from __future__ import annotations

import pytest
import torch

from h3batch.kernels import qk_norm_rope
from h3batch.kernels.qk_norm_rope import reference_qk_norm_rope
from h3batch.worker.h3.config import T2
from h3batch.worker.h3.model import Attention, RotaryEmbedding, apply_rope
from tests.kernels.kernel_cases import CUDA, assert_matches

HEADS, HEAD_DIM, WIDTH = 4, 32, 24  # 4 heads x 32 channels, RoPE on 24 of them (T2's 6 * 4)
EPS = 1e-5


def _tables(seq_len: int, device: str, width: int = WIDTH) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos/sin [S, W] in the model's rotate-half layout (angles repeated over the two halves)."""
    g = torch.Generator().manual_seed(1)
    angles = torch.rand(seq_len, width // 2, generator=g) * 20
    angles = torch.cat((angles, angles), dim=-1).to(device)
    return angles.cos(), angles.sin()


def _inputs(dtype: torch.dtype, device: str, batch: int = 2, seq_len: int = 5, seed: int = 0):
    """qkv [B, S, 3 * heads * hd] of scale ~3, and q/k RMSNorm weights near 1 in the model's dtype."""
    g = torch.Generator().manual_seed(seed)
    qkv = (3 * torch.randn(batch, seq_len, 3 * HEADS * HEAD_DIM, generator=g)).to(dtype).to(device)
    q_weight = (1 + 0.2 * torch.randn(HEAD_DIM, generator=g)).to(dtype).to(device)
    k_weight = (1 + 0.2 * torch.randn(HEAD_DIM, generator=g)).to(dtype).to(device)
    return qkv, q_weight, k_weight


@pytest.mark.parametrize("with_rope", [True, False], ids=["rope", "norm_only"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_triton_matches_eager_reference(device, dtype, with_rope):
    """The kernel's q and k equal the eager path (bf16: rare 1-ulp flips from the fp32 reduction order at most)."""
    qkv, q_weight, k_weight = _inputs(dtype, device)
    rope = _tables(qkv.shape[1], device) if with_rope else None
    q, k = qk_norm_rope(qkv, HEAD_DIM, q_weight, k_weight, EPS, rope, backend="triton")
    q_ref, k_ref = reference_qk_norm_rope(qkv, HEAD_DIM, q_weight, k_weight, EPS, rope)
    for out, ref in ((q, q_ref), (k, k_ref)):
        assert out.shape == (2, 5, HEADS, HEAD_DIM) and out.is_contiguous()
        assert_matches(out, ref, exact=False)


def test_rope_rounding_is_bit_exact(device):
    """With every head's RMS exactly 1 (rows of ±1, eps 0) the norm is exact, and the bf16 RoPE chain
    bf16(bf16(n·cos) + bf16(rot(n)·sin)) of the kernel equals eager torch bit for bit on q, k and pass-through."""
    g = torch.Generator().manual_seed(3)
    signs = torch.randint(0, 2, (2, 7, 3 * HEADS * HEAD_DIM), generator=g) * 2 - 1
    qkv = signs.to(torch.bfloat16).to(device)
    q_weight = (1 + 0.3 * torch.randn(HEAD_DIM, generator=g)).to(torch.bfloat16).to(device)
    k_weight = (0.5 + 0.3 * torch.randn(HEAD_DIM, generator=g)).to(torch.bfloat16).to(device)
    rope = _tables(7, device)
    q, k = qk_norm_rope(qkv, HEAD_DIM, q_weight, k_weight, 0.0, rope, backend="triton")
    q_ref, k_ref = reference_qk_norm_rope(qkv, HEAD_DIM, q_weight, k_weight, 0.0, rope)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    # The rotation really happened (cos != 1 on most channels), and channels >= W only normalized.
    assert (q[..., :WIDTH] != (qkv[..., :HEADS * HEAD_DIM].view_as(q) * q_weight)[..., :WIDTH]).float().mean() > 0.5
    assert torch.equal(q[..., WIDTH:], (qkv[..., :HEADS * HEAD_DIM].view_as(q) * q_weight)[..., WIDTH:])


def test_single_rounding_would_differ():
    """The eager chain's three roundings matter: a one-rounding fp32 RoPE of the same bf16 inputs differs on many
    elements, so the bit-exact test above does pin the rounding order."""
    qkv, q_weight, k_weight = _inputs(torch.bfloat16, "cpu")
    cos, sin = _tables(5, "cpu")
    q, _ = reference_qk_norm_rope(qkv, HEAD_DIM, q_weight, k_weight, EPS, (cos, sin))
    n, _ = reference_qk_norm_rope(qkv, HEAD_DIM, q_weight, k_weight, EPS, None)
    n = n.float()[..., :WIDTH]
    half = WIDTH // 2
    turned = torch.cat((-n[..., half:], n[..., :half]), dim=-1)
    c, s = cos.bfloat16().float()[None, :, None], sin.bfloat16().float()[None, :, None]
    once = (n * c + turned * s).bfloat16()
    assert (once != q[..., :WIDTH]).float().mean() > 0.01


def test_reference_is_the_model_eager_path():
    """The torch reference equals nn.RMSNorm per head followed by h3batch.worker.h3.model.apply_rope, bit for bit."""
    qkv, q_weight, k_weight = _inputs(torch.bfloat16, "cpu")
    norms = [torch.nn.RMSNorm(HEAD_DIM, eps=EPS, dtype=torch.bfloat16) for _ in range(2)]
    with torch.no_grad():
        norms[0].weight.copy_(q_weight)
        norms[1].weight.copy_(k_weight)
        rope = _tables(5, "cpu")
        q, k, _ = qkv.view(2, 5, 3, HEADS, HEAD_DIM).unbind(2)
        eager = (apply_rope(norms[0](q), *rope), apply_rope(norms[1](k), *rope))
    ours = reference_qk_norm_rope(qkv, HEAD_DIM, q_weight, k_weight, EPS, rope)
    assert torch.equal(ours[0], eager[0]) and torch.equal(ours[1], eager[1])


def test_strided_input_views(device):
    """Row-strided qkv (every other row of a wider buffer, columns a prefix of a longer row) and strided cos/sin
    tables give the same result as the contiguous copies."""
    g = torch.Generator().manual_seed(7)
    wide = (2 * torch.randn(2, 10, 3 * HEADS * HEAD_DIM + 40, generator=g)).to(torch.bfloat16).to(device)
    qkv = wide[:, ::2, : 3 * HEADS * HEAD_DIM]  # [2, 5, 384], row stride 2 * 424
    _, q_weight, k_weight = _inputs(torch.bfloat16, device)
    cos_wide, sin_wide = _tables(5, device, width=2 * WIDTH)
    cos, sin = cos_wide[:, :WIDTH], sin_wide[:, :WIDTH]  # row stride 2W
    assert not qkv.is_contiguous() and not cos.is_contiguous()
    strided = qk_norm_rope(qkv, HEAD_DIM, q_weight, k_weight, EPS, (cos, sin), backend="triton")
    packed = qk_norm_rope(qkv.contiguous(), HEAD_DIM, q_weight, k_weight, EPS, (cos.contiguous(), sin.contiguous()),
                          backend="triton")
    reference = reference_qk_norm_rope(qkv, HEAD_DIM, q_weight, k_weight, EPS, (cos, sin))
    for out, same, ref in zip(strided, packed, reference):
        assert torch.equal(out, same)
        assert_matches(out, ref, exact=False)


def test_full_width_rope_and_odd_sizes(device):
    """RoPE over all channels of a head (W = hd) and a head count / head size that are not powers of two work."""
    heads, head_dim = 3, 20
    g = torch.Generator().manual_seed(11)
    qkv = torch.randn(1, 6, 3 * heads * head_dim, generator=g).to(torch.bfloat16).to(device)
    weights = [(1 + 0.1 * torch.randn(head_dim, generator=g)).to(torch.bfloat16).to(device) for _ in range(2)]
    angles = torch.rand(6, head_dim // 2, generator=g)
    angles = torch.cat((angles, angles), -1).to(device)
    rope = (angles.cos(), angles.sin())
    out = qk_norm_rope(qkv, head_dim, *weights, EPS, rope, backend="triton")
    ref = reference_qk_norm_rope(qkv, head_dim, *weights, EPS, rope)
    assert_matches(out[0], ref[0], exact=False)
    assert_matches(out[1], ref[1], exact=False)


@pytest.mark.parametrize("bad,message", [
    (lambda t: dict(t, qkv=t["qkv"][0]), "3-D"),
    (lambda t: dict(t, head_dim=7), "head_dim"),
    (lambda t: dict(t, q_weight=t["q_weight"][:4]), "q_weight"),
    (lambda t: dict(t, rope=(t["rope"][0][:3], t["rope"][1][:3])), "rope"),
    (lambda t: dict(t, rope=(t["rope"][0][:, :5], t["rope"][1][:, :5])), "even"),
    (lambda t: dict(t, eps=-1.0), "eps"),
    (lambda t: dict(t, qkv=t["qkv"].to(torch.float16)), "dtype"),
])
def test_bad_arguments_raise(bad, message):
    """Wrong shapes, widths, dtypes or eps raise ValueError naming the argument."""
    qkv, q_weight, k_weight = _inputs(torch.bfloat16, "cpu")
    args = bad({"qkv": qkv, "head_dim": HEAD_DIM, "q_weight": q_weight, "k_weight": k_weight, "eps": EPS,
                "rope": _tables(5, "cpu")})
    with pytest.raises(ValueError, match=message):
        qk_norm_rope(**args, backend="torch")


def test_attention_module_uses_the_fused_op(device, monkeypatch):
    """h3batch.worker.h3.model.Attention gives the same output with the Triton op as with the eager backend (T2, bf16)."""
    torch.manual_seed(2)
    attention = Attention(T2, torch.bfloat16, compression_gate=False).to(device)
    with torch.no_grad():
        for param in attention.parameters():
            param.normal_(0.0, 0.1)
        attention.q_norm.weight.add_(1.0)
        attention.k_norm.weight.add_(1.0)
        h = torch.randn(1, 9, T2.hidden_size, device=device).to(torch.bfloat16)
        rope = RotaryEmbedding(T2).to(device)(torch.rand(9, 3, dtype=torch.float64, device=device) * 8)
        outputs = {}
        for backend in ("triton", "torch"):
            monkeypatch.setenv("H3BATCH_KERNEL_BACKEND", backend)
            outputs[backend] = attention(h, rope)
    assert_matches(outputs["triton"], outputs["torch"], exact=False)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device: real H3 head geometry against eager CUDA torch")
def test_real_geometry_against_eager_cuda():
    """At 56 heads x 128 with RoPE on 96 channels, the kernel matches eager CUDA torch (≤ 1 bf16 ulp, ≤ 1e-3 differ)."""
    g = torch.Generator().manual_seed(0)
    qkv = (2 * torch.randn(1, 1024, 3 * 56 * 128, generator=g)).to(torch.bfloat16).cuda()
    weights = [(1 + 0.2 * torch.randn(128, generator=g)).to(torch.bfloat16).cuda() for _ in range(2)]
    angles = torch.rand(1024, 48, generator=g) * 100
    angles = torch.cat((angles, angles), -1).cuda()
    rope = (angles.cos(), angles.sin())
    out = qk_norm_rope(qkv, 128, *weights, EPS, rope, backend="triton")
    ref = reference_qk_norm_rope(qkv, 128, *weights, EPS, rope)
    for a, b in zip(out, ref):
        differing = (a != b).float().mean().item()
        print(f"qk_norm_rope real geometry: {differing:.2e} of elements differ from eager CUDA")
        assert_matches(a, b, exact=False)
