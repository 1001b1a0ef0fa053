"""One tiny native DiT block (worker/h3/model.py, config T2) with Triton modulation ops vs the torch reference ops."""
from __future__ import annotations

import pytest
import torch

from h3batch.worker.h3.config import T2
from h3batch.worker.h3.model import DiTBlock, RotaryEmbedding
from tests.kernels.kernel_cases import BF16_TOL

ROWS, STEPS = 23, 2  # S rows of one packed sequence, M distinct timesteps -> 3M = 6 AdaLN table rows


def _block_and_inputs(device: str):
    torch.manual_seed(5)
    block = DiTBlock(T2, torch.bfloat16).to(device)
    with torch.no_grad():
        for param in block.parameters():
            param.normal_(0.0, 0.05)  # adaLN weights too: every table row differs
        block.norm1.weight.add_(1.0)
        block.norm2.weight.add_(1.0)
    x = torch.randn(1, ROWS, T2.hidden_size, device=device).to(torch.bfloat16)
    temb = torch.randn(STEPS, T2.time_embed_dim, device=device)
    adaln_rows = torch.randint(0, 3 * STEPS, (ROWS,), device=device)  # unsorted, duplicates
    positions = torch.rand(ROWS, 3, dtype=torch.float64, device=device) * 8
    rope = RotaryEmbedding(T2).to(device)(positions)
    return block, (x, temb, adaln_rows, rope)


@pytest.mark.parametrize("mode", ["generic", "sm90_bf16_affine"])
def test_block_with_triton_ops_matches_torch_ops(device, mode, monkeypatch):
    """The block's output with Triton modulation ops equals the torch-reference run within bf16 5e-2."""
    block, inputs = _block_and_inputs(device)
    monkeypatch.setenv("H3BATCH_MODULATION_PRECISION", mode)
    outputs = {}
    for backend in ("triton", "torch"):
        monkeypatch.setenv("H3BATCH_KERNEL_BACKEND", backend)
        with torch.no_grad():
            outputs[backend] = block(*inputs)
    assert outputs["triton"].dtype == torch.bfloat16 and outputs["triton"].shape == inputs[0].shape
    torch.testing.assert_close(outputs["triton"], outputs["torch"], atol=BF16_TOL, rtol=BF16_TOL)
    assert (outputs["triton"] != outputs["torch"]).float().mean().item() <= 1e-2  # rare last-bit flips only


def test_block_precision_modes_differ():
    """The same block gives different bf16 outputs under the two precision modes (the knob reaches the block)."""
    block, inputs = _block_and_inputs("cpu")
    outputs = []
    for mode in ("generic", "sm90_bf16_affine"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("H3BATCH_MODULATION_PRECISION", mode)
            mp.setenv("H3BATCH_KERNEL_BACKEND", "torch")
            with torch.no_grad():
                outputs.append(block(*inputs))
    assert not torch.equal(outputs[0], outputs[1])
