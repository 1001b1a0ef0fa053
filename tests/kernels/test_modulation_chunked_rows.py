"""Rows wider than one chunk: every op streams the row in BLOCK_SIZE pieces and still matches its reference."""
from __future__ import annotations

import pytest
import torch

import h3batch.kernels.gate as gate_module
import h3batch.kernels.gate_rms_norm_scale_shift as gate_norm_module
import h3batch.kernels.rms_norm_scale_shift as rms_module
import h3batch.kernels.scale_shift as scale_shift_module
from h3batch.kernels import (
    indexed_gate,
    indexed_gate_rms_norm_scale_shift,
    indexed_scale_shift_,
    rms_norm_indexed_scale_shift,
)
from tests.kernels.kernel_cases import Case, assert_matches, make_inputs

CASE = Case((7,), 336)  # 336 = 2 full 128-column chunks + 80
EPS = 1e-6


@pytest.fixture(params=[128, 64], ids=["3-chunks-resident", "6-chunks-streamed"])
def small_chunks(monkeypatch, request):
    """Force small chunks in every launcher: 128 columns (3 per row, held in registers by the RMS kernel) or 64
    (6 per row, more than it holds: streamed twice); the last chunk is masked either way."""
    block = request.param
    for module in (gate_module, gate_norm_module, rms_module, scale_shift_module):
        monkeypatch.setattr(module, "block_config", lambda hidden: (block, 4))
    assert (rms_module.resident_chunks(CASE.hidden, block) > 0) == (block == 128)


@pytest.mark.parametrize("mode", ["generic", "sm90_bf16_affine"])
def test_chunked_rows_match_reference(device, small_chunks, mode):
    """All four ops with 3 chunks per row equal their references (exact where designed, else within tolerance)."""
    t = make_inputs(CASE, torch.bfloat16, device)
    args = (t["x"], t["weight"], t["shift"], t["scale"], t["indices"], EPS)
    out = {b: rms_norm_indexed_scale_shift(*args, precision=mode, backend=b) for b in ("triton", "torch")}
    assert_matches(out["triton"], out["torch"], exact=False)

    pair = {b: indexed_gate_rms_norm_scale_shift(t["x"], t["gate"], t["branch"], t["weight"], t["shift"], t["scale"],
                                                 t["indices"], EPS, precision=mode, backend=b)
            for b in ("triton", "torch")}
    assert_matches(pair["triton"][0], pair["torch"][0], exact=True)
    assert_matches(pair["triton"][1], pair["torch"][1], exact=False)
    again = rms_norm_indexed_scale_shift(pair["triton"][0], t["weight"], t["shift"], t["scale"], t["indices"], EPS,
                                         precision=mode, backend="triton")
    assert torch.equal(pair["triton"][1], again)  # same chunked reduction order in both RMS kernels

    gated = {b: indexed_gate(t["x"], t["gate"], t["branch"], t["indices"], backend=b) for b in ("triton", "torch")}
    assert_matches(gated["triton"], gated["torch"], exact=True)
    shifted = {b: indexed_scale_shift_(t["x"].clone(), t["shift"], t["scale"], t["indices"], backend=b)
               for b in ("triton", "torch")}
    assert_matches(shifted["triton"], shifted["torch"], exact=True)
