"""Bad shapes, dtypes, devices, strides, indices and eps raise ValueError naming the argument, for every op."""
from __future__ import annotations

import pytest
import torch

from h3batch.kernels import (
    indexed_gate,
    indexed_gate_rms_norm_scale_shift,
    indexed_scale_shift_,
    rms_norm_indexed_scale_shift,
)

H, R, K = 16, 5, 3


def _good() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rows6 = torch.randn(K, 6 * H, generator=g, dtype=torch.float32).to(torch.bfloat16)
    return {"x": torch.randn(R, H, generator=g).to(torch.bfloat16),
            "branch": torch.randn(R, H, generator=g).to(torch.bfloat16),
            "shift": rows6[:, :H], "scale": rows6[:, H:2 * H], "gate": rows6[:, 2 * H:3 * H],
            "weight": torch.ones(H), "indices": torch.tensor([0, 2, 1, 2, 0]), "eps": 1e-6}


def _run_all(t: dict) -> None:
    """Call every op on the same arguments (the torch backend: checks run before any math)."""
    rms_norm_indexed_scale_shift(t["x"], t["weight"], t["shift"], t["scale"], t["indices"], t["eps"],
                                 backend="torch")
    indexed_gate_rms_norm_scale_shift(t["x"], t["gate"], t["branch"], t["weight"], t["shift"], t["scale"],
                                      t["indices"], t["eps"], backend="torch")
    indexed_scale_shift_(t["x"].clone(), t["shift"], t["scale"], t["indices"], backend="torch")
    indexed_gate(t["x"], t["gate"], t["branch"], t["indices"], backend="torch")


def test_good_inputs_pass():
    """The baseline arguments are accepted by all four ops (so each bad case below fails for its one change)."""
    _run_all(_good())


BAD = [
    ("x", lambda t: t["x"][0], "expected a 2-D"),
    ("x", lambda t: t["x"].half(), "expected dtype float32 or bfloat16"),
    ("x", lambda t: t["x"].t().contiguous().t(), "columns must be contiguous"),
    ("shift", lambda t: t["shift"].float(), "expected dtype torch.bfloat16"),
    ("shift", lambda t: t["shift"][:, :8], "expected a 2-D"),
    ("shift", lambda t: torch.zeros(K, 2 * H, dtype=torch.bfloat16)[:, ::2], "columns must be contiguous"),
    ("weight", lambda t: t["weight"][:8], "expected shape"),
    ("indices", lambda t: t["indices"].float(), "expected dtype int64 or int32"),
    ("indices", lambda t: t["indices"][:4], "expected shape"),
    ("indices", lambda t: t["indices"] + 1, r"values must lie in \[0, 3\)"),
    ("indices", lambda t: t["indices"] - 1, r"values must lie in \[0, 3\)"),
    ("eps", lambda t: -1.0, "expected a finite number"),
]


@pytest.mark.parametrize("name,corrupt,message", BAD, ids=[f"{n}-{m}" for n, _, m in BAD])
def test_bad_argument_names_itself(name, corrupt, message):
    """Each corrupted argument raises ValueError whose message starts with the argument's name."""
    t = _good()
    t[name] = corrupt(t)
    ops = [
        lambda: rms_norm_indexed_scale_shift(t["x"], t["weight"], t["shift"], t["scale"], t["indices"], t["eps"]),
        lambda: indexed_gate_rms_norm_scale_shift(t["x"], t["gate"], t["branch"], t["weight"], t["shift"],
                                                  t["scale"], t["indices"], t["eps"]),
        lambda: indexed_scale_shift_(t["x"].clone(), t["shift"], t["scale"], t["indices"]),
        lambda: indexed_gate(t["x"], t["gate"], t["branch"], t["indices"]),
    ]
    uses = {"weight": [0, 1], "eps": [0, 1], "shift": [0, 1, 2]}.get(name, [0, 1, 2, 3])
    for position in uses:
        named = "(x|residual)" if name == "x" else name  # the gate+norm op calls its activation `residual`
        with pytest.raises(ValueError, match=f"^{named}: {message}"):
            ops[position]()


def test_mismatched_branch_is_named():
    """A branch/other of another shape or dtype than the residual raises ValueError naming it."""
    t = _good()
    with pytest.raises(ValueError, match=r"^branch: expected shape \(5, 16\)"):
        indexed_gate_rms_norm_scale_shift(t["x"], t["gate"], t["branch"][:4], t["weight"], t["shift"], t["scale"],
                                          t["indices"], 1e-6)
    with pytest.raises(ValueError, match="^other: expected dtype torch.bfloat16"):
        indexed_gate(t["x"], t["gate"], t["branch"].float(), t["indices"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a device mismatch needs a CUDA device")
def test_device_mismatch_is_named():
    """A table on another device than the activations raises ValueError naming the table."""
    t = _good()
    with pytest.raises(ValueError, match="^gate: expected device"):
        indexed_gate(t["x"].cuda(), t["gate"], t["branch"].cuda(), t["indices"].cuda())
