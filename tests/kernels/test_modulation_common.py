"""modulation_common: row chunks, launch plans, the Hopper predicate, knob resolution, bf16 rounding, block sizes."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import h3batch.kernels.modulation_common as common
from h3batch.kernels.modulation_common import Backend, Precision
from h3batch.kernels.triton_math import round_to_bf16


@pytest.mark.parametrize("rows,expected", [
    (0, []),
    (65535, [(0, 65535)]),
    (65536, [(0, 65535), (65535, 1)]),
    (69888, [(0, 65535), (65535, 4353)]),
])
def test_row_chunks_match_spec(rows, expected):
    """Spec §5.5 chunk iterator lists: (offset, count) with count <= 65535."""
    assert list(common.row_chunks(rows)) == expected


def test_cuda_launches_one_grid_and_the_interpreter_chunks():
    """69888 rows: one CUDA grid at offset 0; chunked (65535, 4353) launches elsewhere."""
    assert common.launch_plan(69888, torch.device("cuda")) == [(0, 69888)]
    assert common.launch_plan(69888, torch.device("cpu")) == [(0, 65535), (65535, 4353)]


@pytest.mark.parametrize("capability,expected", [((9, 0), True), ((10, 3), False), ((8, 0), False)])
def test_sm90_predicate_scope(monkeypatch, capability, expected):
    """Spec §5.5 dispatch scope: capability (9, 0) -> Hopper semantics, (10, 3) and (8, 0) -> generic."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert common.is_sm90_device(torch.device("cuda", 0)) is expected
    assert common.is_sm90_device(torch.device("cpu")) is False


def test_automatic_precision(monkeypatch):
    """None resolves to sm90 only for bf16 inputs on a (patched) Hopper device; env and argument override it."""
    bf16, fp32 = torch.zeros(1, 4, dtype=torch.bfloat16), torch.zeros(1, 4)
    assert common.resolve_precision(None, bf16) is Precision.GENERIC
    monkeypatch.setattr(common, "is_sm90_device", lambda device: True)
    assert common.resolve_precision(None, bf16) is Precision.SM90_BF16_AFFINE
    assert common.resolve_precision(None, fp32) is Precision.GENERIC
    assert common.resolve_precision("generic", bf16) is Precision.GENERIC
    monkeypatch.setenv(common.PRECISION_ENV, "generic")
    assert common.resolve_precision(None, bf16) is Precision.GENERIC
    assert common.resolve_precision(Precision.SM90_BF16_AFFINE, bf16) is Precision.SM90_BF16_AFFINE


def test_bad_precision_values_name_their_source(monkeypatch):
    """Unknown modes, and sm90 on fp32 inputs, raise ValueError naming the argument or env var."""
    fp32 = torch.zeros(1, 4)
    with pytest.raises(ValueError, match="^precision: "):
        common.resolve_precision("fp16", fp32)
    with pytest.raises(ValueError, match="^precision: sm90_bf16_affine needs bf16"):
        common.resolve_precision("sm90_bf16_affine", fp32)
    monkeypatch.setenv(common.PRECISION_ENV, "hopper")
    with pytest.raises(ValueError, match=f"^env {common.PRECISION_ENV}: "):
        common.resolve_precision(None, fp32)


def test_automatic_backend(monkeypatch):
    """CUDA -> triton; CPU -> torch unless TRITON_INTERPRET=1; env var and argument override; bad values raise."""
    kernel = type("InterpretedFunction", (), {})()  # stands in for a kernel built under TRITON_INTERPRET=1
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert common.resolve_backend(None, torch.device("cpu"), kernel) is Backend.TRITON
    assert common.resolve_backend(None, torch.device("cuda"), kernel) is Backend.TRITON
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert common.resolve_backend(None, torch.device("cpu"), kernel) is Backend.TORCH
    assert common.resolve_backend("torch", torch.device("cuda"), kernel) is Backend.TORCH
    monkeypatch.setenv(common.BACKEND_ENV, "torch")
    assert common.resolve_backend(None, torch.device("cuda"), kernel) is Backend.TORCH
    monkeypatch.setenv(common.BACKEND_ENV, "cuda")
    with pytest.raises(ValueError, match=f"^env {common.BACKEND_ENV}: "):
        common.resolve_backend(None, torch.device("cpu"), kernel)
    with pytest.raises(ValueError, match="^backend: "):
        common.resolve_backend("numpy", torch.device("cpu"), kernel)


def test_triton_on_cpu_without_the_interpreter_is_refused():
    """A compiled (non-interpreter) kernel object on CPU tensors is a clear ValueError, never a silent fallback."""
    class CompiledKernel:  # stands in for a JITFunction built without TRITON_INTERPRET
        pass

    with pytest.raises(ValueError, match="^backend: triton on CPU tensors needs TRITON_INTERPRET=1"):
        common.resolve_backend("triton", torch.device("cpu"), CompiledKernel())
    assert common.resolve_backend("triton", torch.device("cuda"), CompiledKernel()) is Backend.TRITON


@pytest.mark.parametrize("hidden,block,warps", [(7, 8, 1), (336, 512, 2), (3072, 2048, 8), (5376, 2048, 8),
                                                (65536, 2048, 8)])
def test_block_config(hidden, block, warps):
    """Chunk = next power of two >= H capped at 2048 columns, warps from the chunk; H = 5376 streams 3 chunks."""
    assert common.block_config(hidden) == (block, warps)


def test_block_config_refuses_wide_rows():
    """Rows wider than the supported maximum raise ValueError naming the hidden size."""
    with pytest.raises(ValueError, match="^hidden size: at most 65536"):
        common.block_config(65537)


@triton.jit
def _round_kernel(src_ptr,  # fp32 [N] values to round
                  dst_ptr,  # fp32 [N] rounded values (exact bf16 values)
                  N: tl.constexpr, NATIVE_CAST: tl.constexpr):
    # One program owns the whole (tiny) vector.
    offsets = tl.arange(0, N)
    tl.store(dst_ptr + offsets, round_to_bf16(tl.load(src_ptr + offsets), NATIVE_CAST))


def _rounding_inputs(device: str) -> torch.Tensor:
    """Ties, carries, overflow, subnormals, signed zero, inf, NaN, then random bit patterns (fp32 [4096])."""
    special = torch.tensor([0x3F808000, 0x3F818000, 0x3F808001, 0x3F7FFFFF, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF,
                            0x00008000, 0x00018000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001],
                           dtype=torch.int64).to(torch.int32).view(torch.float32)
    bits = torch.randint(-2**31, 2**31 - 1, (4096 - special.numel(),), generator=torch.Generator().manual_seed(3),
                         dtype=torch.int64).to(torch.int32)
    return torch.cat([special, bits.view(torch.float32)]).to(device)


def _assert_equal_with_nan(actual: torch.Tensor, expected: torch.Tensor) -> None:
    nan = expected.isnan()
    assert torch.equal(actual.isnan(), nan)
    assert torch.equal(actual[~nan], expected[~nan])


@pytest.mark.parametrize("native_cast", [False, True])
def test_kernel_rounding_matches_torch_cast(device, native_cast):
    """round_to_bf16 equals torch's fp32 -> bf16 cast (nearest even) in both bodies (integer and hardware cast)."""
    if device == "cpu" and native_cast:
        pytest.skip("the interpreter's cast truncates: covered by test_interpreter_cast_truncates")
    values = _rounding_inputs(device)
    out = torch.empty_like(values)
    _round_kernel[(1,)](values, out, N=values.numel(), NATIVE_CAST=native_cast)
    _assert_equal_with_nan(out, values.to(torch.bfloat16).float())


def test_interpreter_cast_truncates(device):
    """Why the integer body exists: in the interpreter a plain fp32 -> bf16 cast truncates normal numbers (and
    mangles subnormals, which the integer body and bf16 loads/stores of normal values never meet)."""
    if device != "cpu":
        pytest.skip("compiled kernels round correctly with the hardware cast (test_kernel_rounding_matches_torch_cast)")
    values = _rounding_inputs(device)
    out = torch.empty_like(values)
    _round_kernel[(1,)](values, out, N=values.numel(), NATIVE_CAST=True)
    truncated = (values.view(torch.int32) & ~0xFFFF).view(torch.float32)
    normal = values.isfinite() & (values.abs() >= torch.finfo(torch.float32).tiny)
    assert torch.equal(out[normal], truncated[normal])
    assert not torch.equal(out[normal], values[normal].to(torch.bfloat16).float())
