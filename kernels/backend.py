"""Which implementation runs an op, and with which rounding: the Backend and Precision enums and their resolution.

Spec h3-model.md §5. Two precision modes (an Enum, never a string inside the package):

* GENERIC: fp32 math, one rounding at the output store. The gate+norm op rounds `u` to the residual's dtype
  (§5.2).
* SM90_BF16_AFFINE (§5.3): in the two RMSNorm ops the normalized row is rounded to bf16, then
  `out = bf16(bf16(n * bf16(scale + 1)) + shift)`, each op rounding as eager bf16 does. `indexed_scale_shift_` and
  `indexed_gate` keep GENERIC semantics in both modes.

Each knob is the argument, else its env variable (read only by `env_setting`), else an automatic choice. The
automatic precision hangs on one predicate, `is_sm90_device`, so tests can patch it.
"""
from __future__ import annotations

import enum
import os

import torch

from h3batch.settings import raw_value

PRECISION_ENV = "H3BATCH_MODULATION_PRECISION"
"""Default precision mode when an op gets `precision=None`: `generic` or `sm90_bf16_affine` (unset = automatic)."""

BACKEND_ENV = "H3BATCH_KERNEL_BACKEND"
"""Default backend when an op gets `backend=None`: `triton` or `torch` (unset = automatic)."""


class Precision(enum.Enum):
    """Rounding semantics of the fused ops (spec §5.2, §5.3)."""

    GENERIC = "generic"
    SM90_BF16_AFFINE = "sm90_bf16_affine"


class Backend(enum.Enum):
    """Which implementation runs an op."""

    TRITON = "triton"
    TORCH = "torch"


def env_setting(name: str) -> str | None:
    """The text of one kernel knob (PRECISION_ENV, BACKEND_ENV), None when unset: the one place they are read.

    Read at each call, not once at start, because the knob only fills in an argument a caller left as None and
    tests flip it per call; the variables are declared (default, doc) with all others in h3batch/settings.py."""
    return raw_value(name)


def is_sm90_device(device: torch.device) -> bool:
    """True where the Hopper bf16-affine semantics are the default: a CUDA device of compute capability 9.x."""
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


def _parse_enum(kind: type[enum.Enum], value: object, source: str) -> enum.Enum:
    if isinstance(value, kind):
        return value
    choices = [member.value for member in kind]
    if isinstance(value, str):
        for member in kind:
            if member.value == value.strip().lower():
                return member
    raise ValueError(f"{source}: expected one of {choices} or None, got {value!r}")


def _env_choice(kind: type[enum.Enum], name: str) -> enum.Enum | None:
    """The member the env knob `name` names, None when it is unset or blank; a bad value raises naming the env."""
    value = env_setting(name)
    if value is None or not value.strip():
        return None
    return _parse_enum(kind, value, f"env {name}")


def resolve_precision(precision: Precision | str | None, x: torch.Tensor) -> Precision:
    """Argument, else env var, else SM90_BF16_AFFINE for bf16 inputs on a 9.x GPU and GENERIC elsewhere."""
    if precision is None:
        precision = _env_choice(Precision, PRECISION_ENV)
    if precision is None:
        if x.dtype == torch.bfloat16 and is_sm90_device(x.device):
            return Precision.SM90_BF16_AFFINE
        return Precision.GENERIC
    mode = _parse_enum(Precision, precision, "precision")
    if mode is Precision.SM90_BF16_AFFINE and x.dtype != torch.bfloat16:
        raise ValueError(f"precision: sm90_bf16_affine needs bf16 inputs, got {x.dtype}")
    return mode


def triton_interpret_requested() -> bool:
    """True when TRITON_INTERPRET is set to a true value (Triton's own spelling: 1, true, on, yes)."""
    # Triton's own variable, not an h3batch knob: it must be read where Triton reads it, in os.environ.
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def is_interpreted(kernel: object) -> bool:
    """True for a @triton.jit object built under TRITON_INTERPRET=1 (it runs on CPU; its bf16 casts truncate)."""
    return type(kernel).__name__ == "InterpretedFunction"


def resolve_backend(backend: Backend | str | None, device: torch.device, kernel: object) -> Backend:
    """Argument, else env var, else triton on CUDA and on CPU only under TRITON_INTERPRET=1 (torch otherwise).

    `kernel` is the op's @triton.jit object: choosing triton for CPU tensors needs it to have been built by the
    interpreter (TRITON_INTERPRET=1 set before the kernels were imported), and a compiled one needs CUDA tensors.
    """
    if backend is None:
        backend = _env_choice(Backend, BACKEND_ENV)
    if backend is None:
        backend = Backend.TRITON if device.type == "cuda" or triton_interpret_requested() else Backend.TORCH
    choice = _parse_enum(Backend, backend, "backend")
    if choice is Backend.TRITON:
        if device.type == "cpu" and not is_interpreted(kernel):
            raise ValueError("backend: triton on CPU tensors needs TRITON_INTERPRET=1 set before `kernels` is "
                             "imported; use backend='torch' or CUDA tensors")
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"backend: triton runs on cuda (or cpu under TRITON_INTERPRET=1), got {device}")
    return choice
