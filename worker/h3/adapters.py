"""Per-job LoRAs on the resident DiT: unfused low-rank deltas added through forward hooks, never written into weights.

A job names up to N adapters with a scale each (core/loras.py checks the request). For the job, every targeted
``nn.Linear`` of the resident ``H3Transformer`` gets one forward hook that adds ``scale · (x Aᵀ) Bᵀ`` to the rows of
its output the adapter covers; after the job the hooks are removed. The base weights are never touched, so they are
bit-identical after any number of apply/remove cycles (tests/worker/h3/dit/test_adapters.py runs 100).

Why unfused: fusing ``W += s·B A`` and later ``W -= s·B A`` in bf16 rounds twice, and the second rounding does not
undo the first (the same test shows a fused-then-unfused bf16 weight differs from the original). The unfused path
costs two thin GEMMs per hooked projection and step (bench/adapters.py measures it at real size).

Adapter files are read by diffusers' ``MiniMaxH3LoraLoaderMixin.lora_state_dict``, which normalises every published
H3 LoRA layout (diffusers, peft dumps, kohya/musubi, ai-toolkit, DiffSynth) onto diffusers' module names; this module
only maps those names onto the native modules, as ``loader.map_diffusers_name`` does for full checkpoints. That
mapping, the row placement into the packed QKV and the gate-first ``fc1`` are what no library does for our module
tree, hence written here. Scaling follows diffusers + peft: ``alpha / rank`` when the file records an alpha,
else 1, times the job's scale.

Loaded adapters are kept on the worker in ``LoraCache``, an LRU bounded by the bytes of the factors it holds.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import torch
import torch.nn as nn

from h3batch.worker.h3.loader import map_diffusers_name
from h3batch.worker.h3.model import H3Transformer

_PARTITION_PREFIX = "transformer."


class AdapterError(ValueError):
    """An adapter that cannot be applied to this model; the message names the key and what was expected."""


@dataclass(frozen=True)
class LowRank:
    """One low-rank delta on a slice of a Linear's output rows: out[..., start:stop] += scale · (x Aᵀ) Bᵀ."""

    a: torch.Tensor  # [r, in_features]
    b: torch.Tensor  # [stop - start, r]
    start: int
    stop: int
    scale: float  # alpha / rank (1.0 for alpha-less files)


@dataclass(frozen=True)
class LoraWeights:
    """One adapter in native module names: module path -> the deltas on it (a packed qkv_proj has up to three)."""

    name: str
    deltas: Mapping[str, tuple[LowRank, ...]]
    nbytes: int = 0

    @property
    def rank(self) -> int:
        return max((d.a.shape[0] for ds in self.deltas.values() for d in ds), default=0)


def _module_shapes(model: nn.Module) -> dict[str, tuple[int, int]]:
    """Linear module path -> (out_features, in_features) from its weight (a sharded model shows its local rows)."""
    return {name: tuple(m.weight.shape) for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def native_lora(
    name: str,
    state_dict: Mapping[str, torch.Tensor],
    model: H3Transformer,
    *,
    network_alpha: float | None = None,
    dtype: torch.dtype | None = None,
) -> LoraWeights:
    """Diffusers-named LoRA factors (``transformer.<module>.lora_A.weight`` / ``lora_B``) -> native deltas on ``model``.

    Refuses, naming the first bad key: a key that is not a lora factor, a module with no native Linear, a lone factor,
    ranks of A and B that differ, factor shapes that do not fit the target's rows and columns. Factors are stored in
    the target weight's dtype and device (``dtype`` overrides the dtype).
    """
    shapes = _module_shapes(model)
    params = dict(model.named_parameters())
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key in sorted(state_dict):
        body = key.removeprefix(_PARTITION_PREFIX)
        for role in ("lora_A", "lora_B"):
            suffix = f".{role}.weight"
            if body.endswith(suffix):
                pairs.setdefault(body[: -len(suffix)], {})[role] = state_dict[key]
                break
        else:
            raise AdapterError(f"adapter {name}: key {key} is not a LoRA factor (expected <module>.lora_A/B.weight)")
    inner = model.config.inner_dim
    deltas: dict[str, list[LowRank]] = {}
    nbytes = 0
    for module in sorted(pairs):
        factors = pairs[module]
        key = f"{_PARTITION_PREFIX}{module}.{next(iter(factors))}.weight"
        try:
            target = map_diffusers_name(f"{module}.weight")
        except ValueError:
            raise AdapterError(f"adapter {name}: key {key} names no module of the H3 DiT") from None
        native = target.name.removesuffix(".weight")
        if native not in shapes or target.name not in params:
            raise AdapterError(f"adapter {name}: key {key} names no Linear of the DiT ({native})")
        if set(factors) != {"lora_A", "lora_B"}:
            missing = ({"lora_A", "lora_B"} - set(factors)).pop()
            raise AdapterError(f"adapter {name}: {module} has no {missing} factor")
        a, b = factors["lora_A"], factors["lora_B"]
        out_rows, in_cols = shapes[native]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise AdapterError(
                f"adapter {name}: rank mismatch at {module}: lora_A {list(a.shape)}, lora_B {list(b.shape)} "
                "(expected [r, in] and [out, r])"
            )
        start, stop = 0, out_rows
        if target.qkv_part is not None:
            if out_rows != 3 * inner:
                raise AdapterError(f"adapter {name}: {native} is sharded ({out_rows} rows); LoRAs need the whole DiT")
            start = "qkv".index(target.qkv_part) * inner
            stop = start + inner
        if a.shape[1] != in_cols or b.shape[0] != stop - start:
            raise AdapterError(
                f"adapter {name}: shape mismatch at {module}: delta [{b.shape[0]}, {a.shape[1]}] vs "
                f"[{stop - start}, {in_cols}] of {native}"
            )
        if target.swap_halves:  # D [value; gate] -> N [gate; up]: permute B's rows, not the product's
            half = b.shape[0] // 2
            b = torch.cat((b[half:], b[:half]), dim=0)
        rank = a.shape[0]
        scale = 1.0 if network_alpha is None else network_alpha / rank
        weight = params[target.name]
        cast = dict(device=weight.device, dtype=dtype or weight.dtype)
        delta = LowRank(a.to(**cast).contiguous(), b.to(**cast).contiguous(), start, stop, scale)
        deltas.setdefault(native, []).append(delta)
        nbytes += delta.a.nbytes + delta.b.nbytes
    if not deltas:
        raise AdapterError(f"adapter {name}: no LoRA factors")
    return LoraWeights(name, {k: tuple(v) for k, v in deltas.items()}, nbytes)


def read_lora_file(path: str | Path) -> tuple[dict[str, torch.Tensor], float | None]:
    """An adapter file (or a folder holding one) through diffusers' H3 loader: (diffusers-named factors, alpha).

    ``alpha`` is the network alpha the file records in its metadata (diffusers then scales each module by
    ``alpha / rank``); None for alpha-less files, which load at ``alpha == rank``.
    """
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    path = Path(path)
    kwargs = {}
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if len(files) != 1:
            raise AdapterError(f"adapter folder {path}: expected one .safetensors file, found {len(files)}")
        kwargs = {"weight_name": files[0].name}
    state_dict, metadata = MiniMaxH3LoraLoaderMixin.lora_state_dict(
        str(path), return_lora_metadata=True, local_files_only=True, **kwargs
    )
    alpha = None
    if metadata:
        value = metadata.get(f"{_PARTITION_PREFIX}lora_alpha")
        alpha = None if value is None else float(value)
    return dict(state_dict), alpha


# Applying ------------------------------------------------------------------------------------------------------------


@dataclass
class _LinearDeltas:
    """Everything the active adapters add to one Linear's output."""

    items: list[tuple[LowRank, float]] = field(default_factory=list)  # (delta, job scale)

    def __call__(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
        x = inputs[0]
        for delta, job_scale in self.items:
            # Same order of operations as peft's LoRA Linear: B(A(x)) in the factor dtype, times the scale, added.
            low = (x.to(delta.a.dtype) @ delta.a.t()) @ delta.b.t()
            update = (low * (delta.scale * job_scale)).to(output.dtype)
            if delta.start == 0 and delta.stop == output.shape[-1]:
                output = output + update
            else:  # a third of the packed qkv_proj: in place (inference; the output is this hook's own tensor)
                output[..., delta.start : delta.stop] += update
        return output


class AppliedLoras:
    """Hooks of one job's adapter set on the model; ``remove()`` takes every one off (idempotent)."""

    def __init__(self, handles: list, names: tuple[str, ...]):
        self._handles = handles
        self.names = names

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()


def apply_loras(model: H3Transformer, adapters: Sequence[tuple[LoraWeights, float]]) -> AppliedLoras:
    """Hook every Linear the adapters touch: its output gains Σ scale_job · scale · (x Aᵀ) Bᵀ on the covered rows."""
    modules = dict(model.named_modules())
    per_module: dict[str, _LinearDeltas] = {}
    for weights, job_scale in adapters:
        for path, deltas in weights.deltas.items():
            if path not in modules:
                raise AdapterError(f"adapter {weights.name}: {path} is not a module of this DiT")
            hook = per_module.setdefault(path, _LinearDeltas())
            hook.items.extend((d, float(job_scale)) for d in deltas)
    handles = [modules[path].register_forward_hook(hook) for path, hook in per_module.items()]
    return AppliedLoras(handles, tuple(w.name for w, _ in adapters))


@contextlib.contextmanager
def loras_applied(model: H3Transformer, adapters: Sequence[tuple[LoraWeights, float]]) -> Iterator[AppliedLoras]:
    """``apply_loras`` for the body of a ``with``; the hooks come off however the body ends."""
    applied = apply_loras(model, adapters)
    try:
        yield applied
    finally:
        applied.remove()


@torch.no_grad()
def fuse_into_weights(model: H3Transformer, weights: LoraWeights, job_scale: float, *, sign: float = 1.0) -> None:
    """``W[rows] += sign · scale · B A`` in the weight's dtype: the fused alternative, kept for the bit-stability test
    and the bench; the service never calls it (see the module docstring)."""
    params = dict(model.named_parameters())
    for path, deltas in weights.deltas.items():
        weight = params[f"{path}.weight"]
        for d in deltas:
            product = (d.b.float() @ d.a.float()) * (sign * d.scale * job_scale)
            weight[d.start : d.stop] += product.to(weight.dtype)


# Worker cache --------------------------------------------------------------------------------------------------------


class LoraCache:
    """LRU of loaded adapters bounded by the bytes of their factors; thread-safe (the heartbeat thread reads stats).

    ``get(key, load)`` returns the cached ``LoraWeights`` or calls ``load()`` and keeps the result, evicting the least
    recently used entries until the total fits ``max_bytes``. An adapter larger than the whole budget is refused.
    """

    def __init__(self, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"LoRA cache: expected a positive byte budget, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, LoraWeights] = OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0  # how many times ``load`` ran (a hit does not count)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(w.nbytes for w in self._entries.values())

    def keys(self) -> list[str]:
        """Cached keys, least recently used first."""
        with self._lock:
            return list(self._entries)

    def get(self, key: str, load: Callable[[], LoraWeights]) -> LoraWeights:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        weights = load()
        self.loads += 1
        if weights.nbytes > self.max_bytes:
            raise AdapterError(
                f"adapter {key}: {weights.nbytes} bytes of factors exceed the LoRA cache ({self.max_bytes} bytes)"
            )
        with self._lock:
            self._entries[key] = weights
            self._entries.move_to_end(key)
            while sum(w.nbytes for w in self._entries.values()) > self.max_bytes:
                self._entries.popitem(last=False)
        return weights


# A worker's per-job LoRAs ---------------------------------------------------------------------------------------------


def lora_folder(item: Mapping, hf_cache: str | Path | None = None) -> Path:
    """Where one accepted adapter's file lives on this worker: the operator's folder, or the Hub repo at its commit in
    the hub cache (downloaded once by huggingface_hub; with ``HF_HUB_OFFLINE=1`` only what the cache holds)."""
    if item.get("path"):
        return Path(item["path"])
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(item["repo"], revision=item["revision"], cache_dir=hf_cache,
                                  allow_patterns=["*.safetensors", "*.json"]))


class WorkerLoras:
    """The per-job LoRAs of one resident DiT: the byte-bounded cache and the adapter set applied now.

    ``use(items)`` makes the DiT carry exactly ``items`` (core/loras.py records: ref, scale, repo+revision or path):
    a job whose set equals the applied one changes nothing, so back-to-back jobs of one set (a batch with one LoRA)
    apply it once; any other set is swapped in; ``[]`` removes every hook. ``applies`` counts the swaps.
    """

    def __init__(self, model: H3Transformer, max_bytes: int, hf_cache: str | Path | None = None):
        self.model = model
        self.cache = LoraCache(max_bytes)
        self.hf_cache = hf_cache
        self.applied: AppliedLoras | None = None
        self.key = ""
        self.applies = 0

    def _weights(self, item: Mapping) -> LoraWeights:
        key = f"{item['repo']}@{item['revision']}" if item.get("repo") else str(item["path"])

        def load() -> LoraWeights:
            state_dict, alpha = read_lora_file(lora_folder(item, self.hf_cache))
            return native_lora(key, state_dict, self.model, network_alpha=alpha)

        return self.cache.get(key, load)

    def use(self, items: Sequence[Mapping]) -> None:
        """Apply exactly ``items`` (AdapterError, nothing applied, when one does not fit this DiT)."""
        from h3batch.core.loras import adapter_set_key

        key = adapter_set_key(items)
        if key == self.key:
            return
        adapters = [(self._weights(item), float(item["scale"])) for item in items]  # all load before any swap
        self.clear()
        if adapters:
            self.applied = apply_loras(self.model, adapters)
            self.key = key
            self.applies += 1

    def clear(self) -> None:
        if self.applied is not None:
            self.applied.remove()
        self.applied, self.key = None, ""
