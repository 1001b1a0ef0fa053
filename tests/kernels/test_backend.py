"""backend: the Hopper predicate, precision and backend resolution (argument, env knob, automatic choice)."""
from __future__ import annotations

import pytest
import torch

import h3batch.kernels.backend as backend
from h3batch.kernels.backend import Backend, Precision


@pytest.mark.parametrize("capability,expected", [((9, 0), True), ((10, 3), False), ((8, 0), False)])
def test_sm90_predicate_scope(monkeypatch, capability, expected):
    """Spec §5.5 dispatch scope: capability (9, 0) -> Hopper semantics, (10, 3) and (8, 0) -> generic."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert backend.is_sm90_device(torch.device("cuda", 0)) is expected
    assert backend.is_sm90_device(torch.device("cpu")) is False


def test_automatic_precision(monkeypatch):
    """None resolves to sm90 only for bf16 inputs on a (patched) Hopper device; env and argument override it."""
    bf16, fp32 = torch.zeros(1, 4, dtype=torch.bfloat16), torch.zeros(1, 4)
    assert backend.resolve_precision(None, bf16) is Precision.GENERIC
    monkeypatch.setattr(backend, "is_sm90_device", lambda device: True)
    assert backend.resolve_precision(None, bf16) is Precision.SM90_BF16_AFFINE
    assert backend.resolve_precision(None, fp32) is Precision.GENERIC
    assert backend.resolve_precision("generic", bf16) is Precision.GENERIC
    monkeypatch.setenv(backend.PRECISION_ENV, "generic")
    assert backend.resolve_precision(None, bf16) is Precision.GENERIC
    assert backend.resolve_precision(Precision.SM90_BF16_AFFINE, bf16) is Precision.SM90_BF16_AFFINE


def test_bad_precision_values_name_their_source(monkeypatch):
    """Unknown modes, and sm90 on fp32 inputs, raise ValueError naming the argument or env var."""
    fp32 = torch.zeros(1, 4)
    with pytest.raises(ValueError, match="^precision: "):
        backend.resolve_precision("fp16", fp32)
    with pytest.raises(ValueError, match="^precision: sm90_bf16_affine needs bf16"):
        backend.resolve_precision("sm90_bf16_affine", fp32)
    monkeypatch.setenv(backend.PRECISION_ENV, "hopper")
    with pytest.raises(ValueError, match=f"^env {backend.PRECISION_ENV}: "):
        backend.resolve_precision(None, fp32)


def test_automatic_backend(monkeypatch):
    """CUDA -> triton; CPU -> torch unless TRITON_INTERPRET=1; env var and argument override; bad values raise."""
    kernel = type("InterpretedFunction", (), {})()  # stands in for a kernel built under TRITON_INTERPRET=1
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert backend.resolve_backend(None, torch.device("cpu"), kernel) is Backend.TRITON
    assert backend.resolve_backend(None, torch.device("cuda"), kernel) is Backend.TRITON
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert backend.resolve_backend(None, torch.device("cpu"), kernel) is Backend.TORCH
    assert backend.resolve_backend("torch", torch.device("cuda"), kernel) is Backend.TORCH
    monkeypatch.setenv(backend.BACKEND_ENV, "torch")
    assert backend.resolve_backend(None, torch.device("cuda"), kernel) is Backend.TORCH
    monkeypatch.setenv(backend.BACKEND_ENV, "cuda")
    with pytest.raises(ValueError, match=f"^env {backend.BACKEND_ENV}: "):
        backend.resolve_backend(None, torch.device("cpu"), kernel)
    with pytest.raises(ValueError, match="^backend: "):
        backend.resolve_backend("numpy", torch.device("cpu"), kernel)


def test_triton_on_cpu_without_the_interpreter_is_refused():
    """A compiled (non-interpreter) kernel object on CPU tensors is a clear ValueError, never a silent fallback."""
    class CompiledKernel:  # stands in for a JITFunction built without TRITON_INTERPRET
        pass

    with pytest.raises(ValueError, match="^backend: triton on CPU tensors needs TRITON_INTERPRET=1"):
        backend.resolve_backend("triton", torch.device("cpu"), CompiledKernel())
    assert backend.resolve_backend("triton", torch.device("cuda"), CompiledKernel()) is Backend.TRITON


def test_env_setting_reads_the_environment(monkeypatch):
    """env_setting returns a knob's stripped text, and None when the variable is unset or blank."""
    assert backend.env_setting(backend.BACKEND_ENV) is None
    monkeypatch.setenv(backend.BACKEND_ENV, " Torch ")
    assert backend.env_setting(backend.BACKEND_ENV) == "Torch"
    monkeypatch.setenv(backend.BACKEND_ENV, "  ")
    assert backend.env_setting(backend.BACKEND_ENV) is None


def test_blank_env_knobs_mean_automatic(monkeypatch):
    """A knob set to blanks is treated as unset: the automatic choice applies, no ValueError."""
    monkeypatch.setenv(backend.PRECISION_ENV, "  ")
    monkeypatch.setenv(backend.BACKEND_ENV, "")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert backend.resolve_precision(None, torch.zeros(1, 4, dtype=torch.bfloat16)) is Precision.GENERIC
    assert backend.resolve_backend(None, torch.device("cpu"), object()) is Backend.TORCH


def test_both_knobs_are_read_through_env_setting(monkeypatch):
    """With env_setting patched (as a settings object would replace it), both knobs follow it, not os.environ."""
    monkeypatch.setenv(backend.PRECISION_ENV, "generic")
    monkeypatch.setenv(backend.BACKEND_ENV, "triton")
    knobs = {backend.PRECISION_ENV: "sm90_bf16_affine", backend.BACKEND_ENV: "torch"}
    seen = []
    monkeypatch.setattr(backend, "env_setting", lambda name: seen.append(name) or knobs.get(name))
    bf16 = torch.zeros(1, 4, dtype=torch.bfloat16)
    assert backend.resolve_precision(None, bf16) is Precision.SM90_BF16_AFFINE
    assert backend.resolve_backend(None, torch.device("cuda"), object()) is Backend.TORCH
    assert seen == [backend.PRECISION_ENV, backend.BACKEND_ENV]
    # An explicit argument never consults the knob.
    assert backend.resolve_precision("generic", bf16) is Precision.GENERIC
    assert backend.resolve_backend("triton", torch.device("cuda"), object()) is Backend.TRITON
    assert seen == [backend.PRECISION_ENV, backend.BACKEND_ENV]
