"""Where the text encoder's weights live between prompts: on the GPU, or in host memory with visits to the GPU.

On one H200 the DiT (65.3 GiB), the served VAEs and the 50-layer Qwen3-VL text stack (46.9 GiB) leave too little room
for the activations of a long clip (worker/h3/memory_plan.py has the arithmetic). The encoder runs once per request
and for a few tens of milliseconds, so it need not stay beside the DiT:

* ``resident``: the text stack lives on the GPU.
* ``offload``:  the text stack lives in pinned host memory; before a prompt is encoded every weight is copied to the
  GPU, after it the GPU copies are dropped (``settle``). With a ``keep_max_rows`` the GPU copy stays between jobs
  whose packed rows fit beside it (the plan's figure), so short clips do not pay the copy, and is dropped only when
  a longer clip needs the room.
* ``stream``:   the text stack lives in pinned host memory and visits the GPU one unit at a time (the embedding
  table, then each decoder layer), copied in by a forward pre-hook and dropped by a forward hook: at most one
  decoder layer (0.9 GiB at real width) is on the GPU.

Whatever the mode, the same weights run the same kernels on the same device, so the features are bit-identical to
the resident encoder's (tests/worker/h3/decode/test_text_placement.py). The vision tower and the LM head never run
for a text prompt and stay in host memory in every mode. The master copy is never written: a visit is a copy
(`Tensor.to(device, copy=True)`), on the CPU too, so the CPU tests exercise the same swap as the GPU.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("h3batch.text_placement")

MODES = ("resident", "offload", "stream")


def _tensors(module: torch.nn.Module):
    """(owner module, attribute name, is_parameter) of every parameter and buffer directly or below `module`."""
    for owner in module.modules():
        for name, _ in owner.named_parameters(recurse=False):
            yield owner, name, True
        for name, buffer in owner.named_buffers(recurse=False):
            if buffer is not None:
                yield owner, name, False


class _Unit:
    """One module whose tensors have a host master copy and, while visiting, a device copy."""

    def __init__(self, module: torch.nn.Module, pin: bool):
        self.module = module
        self.entries = []  # (owner, name, is_parameter, host tensor)
        for owner, name, is_param in _tensors(module):
            tensor = (getattr(owner, name).data if is_param else getattr(owner, name)).detach()
            if pin and not (tensor.device.type == "cpu" and tensor.is_pinned()):
                host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)  # straight from the GPU too
                host.copy_(tensor)
            else:
                host = tensor.to("cpu")
            self.entries.append((owner, name, is_param, host))
        self.on_device = False
        self.nbytes = sum(host.numel() * host.element_size() for *_, host in self.entries)
        self._point_at_host()

    def _set(self, owner, name, is_param, tensor) -> None:
        if is_param:
            getattr(owner, name).data = tensor
        else:
            owner._buffers[name] = tensor

    def _point_at_host(self) -> None:
        for owner, name, is_param, host in self.entries:
            self._set(owner, name, is_param, host)

    def visit(self, device: torch.device) -> None:
        if self.on_device:
            return
        for owner, name, is_param, host in self.entries:
            self._set(owner, name, is_param, host.to(device, non_blocking=True, copy=True))
        self.on_device = True

    def leave(self) -> None:
        if self.on_device:
            self._point_at_host()
            self.on_device = False


class HostedTextEncoder:
    """A `TextEncoder` whose text stack lives in host memory and visits `device` to encode (module docstring).

    Offers `encode(prompt)` like the TextEncoder, plus `settle(sequence_rows)`, which the pipeline calls once the
    request's packed row count is known, before the denoise needs the room."""

    def __init__(self, encoder, device: str | torch.device, mode: str = "offload", *, keep_max_rows: int = 0):
        if mode not in ("offload", "stream"):
            raise ValueError(f"text encoder placement: expected offload or stream for a hosted encoder, got {mode!r}")
        self.encoder = encoder
        self.device = torch.device(device)
        self.mode = mode
        self.keep_max_rows = keep_max_rows
        pin = self.device.type == "cuda"
        stack = encoder.text_stack
        _idle_parts_to_host(encoder)
        units = [stack.embed_tokens, *stack.layers]
        unit_ids = {id(m) for unit in units for m in unit.modules()}
        # The few small tensors of the stack outside the units (rotary tables; the norm is an identity) stay on
        # the device.
        for owner, name, is_param in list(_tensors(stack)):
            if id(owner) not in unit_ids:
                tensor = getattr(owner, name)
                self._move_small(owner, name, is_param, tensor)
        if mode == "offload":
            self.units = [_Unit(stack, pin)]
        else:
            self.units = [_Unit(unit, pin) for unit in units]
            encoder.placement_hooks = [handle for unit in self.units for handle in (
                unit.module.register_forward_pre_hook(lambda module, args, unit=unit: unit.visit(self.device)),
                unit.module.register_forward_hook(lambda module, args, out, unit=unit: unit.leave()))]
        encoder.device = self.device
        self.nbytes = sum(unit.nbytes for unit in self.units)
        self.largest_unit_bytes = max(unit.nbytes for unit in self.units)
        if pin:
            torch.cuda.empty_cache()

    def _move_small(self, owner, name, is_param, tensor) -> None:
        moved = tensor.detach().to(self.device)
        if is_param:
            tensor.data = moved
        else:
            owner._buffers[name] = moved

    @property
    def on_device(self) -> bool:
        return any(unit.on_device for unit in self.units)

    @property
    def tokenizer(self):
        return self.encoder.tokenizer

    def tokenize(self, prompt: str) -> list[int]:
        return self.encoder.tokenize(prompt)

    def encode(self, prompt: str) -> tuple[torch.Tensor, int]:
        """(features [1, L, text_dim] on the device, L), as `TextEncoder.encode`; the prompt is checked before any
        weight moves."""
        self.encoder.tokenize(prompt)  # refuse a bad prompt before copying tens of GiB
        if self.mode == "offload":
            self.units[0].visit(self.device)
        try:
            return self.encoder.encode(prompt)
        finally:
            if self.mode == "stream":
                for unit in self.units:  # a layer that raised mid-forward must not stay on the device
                    unit.leave()

    def settle(self, sequence_rows: int) -> None:
        """After encoding a request of `sequence_rows` packed rows: drop the device copy unless the clip fits beside
        it (offload with `keep_max_rows`)."""
        if self.on_device and sequence_rows > self.keep_max_rows:
            self.release()

    def release(self) -> None:
        """Drop every device copy (the host master copy stays)."""
        for unit in self.units:
            unit.leave()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _idle_parts_to_host(encoder) -> None:
    """The vision tower and the LM head never run for a text prompt: host memory, no device copy ever."""
    for module in (getattr(encoder.model, "lm_head", None), getattr(encoder.model.model, "visual", None)):
        if module is not None:
            module.to("cpu")


def place_text_encoder(encoder, device: str | torch.device, mode: str, *, keep_max_rows: int = 0):
    """The encoder as the pipeline should hold it: the `TextEncoder` itself with its text stack on `device`
    (resident; the vision tower and LM head on the host), or a `HostedTextEncoder`."""
    device = torch.device(device)
    if mode not in MODES:
        raise ValueError(f"text encoder placement: expected one of {', '.join(MODES)}, got {mode!r}")
    for handle in getattr(encoder, "placement_hooks", ()):  # placed before as `stream`: its hooks go
        handle.remove()
    encoder.placement_hooks = []
    if mode == "resident":
        _idle_parts_to_host(encoder)
        encoder.text_stack.to(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        encoder.device = device
        return encoder
    return HostedTextEncoder(encoder, device, mode, keep_max_rows=keep_max_rows)
