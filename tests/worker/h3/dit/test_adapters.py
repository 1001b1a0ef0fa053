"""Per-job LoRAs (worker/h3/adapters.py): parity with diffusers' H3 LoRA loader + peft, bit-stable base weights,
refusal of bad adapters, the size-bounded LRU."""

import pytest
import torch
from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin
from safetensors.torch import save_file

from h3batch.worker.h3.adapters import (
    AdapterError,
    LoraCache,
    apply_loras,
    fuse_into_weights,
    loras_applied,
    native_lora,
    read_lora_file,
)
from h3batch.worker.h3.config import T2
from h3batch.worker.h3.model import H3Transformer
from h3batch.worker.h3.tiny_adapters import random_lora_state_dict
from tests.worker.h3.dit.dit_oracle import gate_tensors, make_oracle, oracle_forward, t2va_inputs
from tests.worker.h3.dit.test_dit_model import max_diff, native_from_oracle, run

FP32_ATOL = 1e-4


class _LoraHolder(MiniMaxH3LoraLoaderMixin):
    """The smallest pipeline the diffusers mixin loads into: it holds the ``transformer`` partition only."""

    hf_device_map = None  # what the mixin asks a pipeline before loading (no offloading here)

    def __init__(self, transformer):
        self.transformer = transformer
        self.components = {"transformer": transformer}


def _write(path, state_dict, alpha=None):
    save_file(state_dict, str(path), metadata=None if alpha is None else {"alpha": str(alpha)})
    return path


@pytest.fixture(scope="module")
def pair():
    """A random T2 oracle (fp32) and the native fp32 model with its weights."""
    oracle = make_oracle(T2, seed=0)
    return oracle, native_from_oracle(T2, oracle, gates=gate_tensors(T2, seed=None))


def test_parity_with_diffusers_lora_loader(tmp_path, pair):
    """Two adapters (alpha-less rank 4, rank 8 with a recorded alpha) at scales 0.7 and -0.4: the native hooked DiT's
    outputs equal diffusers' after ``load_lora_weights`` + ``set_adapters`` (fp32, both heads, ≤ 1e-4)."""
    oracle, native = pair
    inputs = t2va_inputs(T2, batch=2)
    base_video, _ = oracle_forward(oracle, inputs)
    first = _write(tmp_path / "a.safetensors", random_lora_state_dict(T2, rank=4, seed=1))
    second = _write(tmp_path / "b.safetensors", random_lora_state_dict(T2, rank=8, seed=2), alpha=16)

    holder = _LoraHolder(oracle)
    holder.load_lora_weights(str(first), adapter_name="a")
    holder.load_lora_weights(str(second), adapter_name="b")
    oracle.set_adapters(["a", "b"], weights=[0.7, -0.4])
    try:
        expected_video, expected_audio = oracle_forward(oracle, inputs)
    finally:
        oracle.delete_adapters(["a", "b"])

    adapters = []
    for path, scale in ((first, 0.7), (second, -0.4)):
        state_dict, alpha = read_lora_file(path)
        adapters.append((native_lora(path.stem, state_dict, native, network_alpha=alpha), scale))
    assert adapters[1][0].deltas["blocks.0.attn.qkv_proj"][0].scale == 2.0  # alpha 16 / rank 8
    with loras_applied(native, adapters):
        video, audio = run(native, inputs)
    assert max_diff(expected_video, base_video) > 0.05  # the adapters change the output
    assert max_diff(video, expected_video) <= FP32_ATOL
    assert max_diff(audio, expected_audio) <= FP32_ATOL


def test_base_weights_bit_identical_after_100_cycles():
    """bf16 DiT: 100 apply / forward / remove cycles leave every weight and the base output bit-identical."""
    torch.manual_seed(0)
    model = H3Transformer(T2, dtype=torch.bfloat16).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = t2va_inputs(T2)
    base = run(model, inputs)
    weights = native_lora("a", random_lora_state_dict(T2, rank=4, seed=3), model)
    for cycle in range(100):
        applied = apply_loras(model, [(weights, 0.5 + cycle / 100)])
        if cycle % 10 == 0:
            adapted = run(model, inputs)
            assert not torch.equal(adapted[0], base[0])
        applied.remove()
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    for got, expected in zip(run(model, inputs), base):
        assert torch.equal(got, expected)
    assert not any(m._forward_hooks for m in model.modules())


def test_fused_then_unfused_bf16_is_not_bit_stable():
    """Why the service hooks instead of fusing: W + sBA - sBA in bf16 does not give W back."""
    torch.manual_seed(0)
    model = H3Transformer(T2, dtype=torch.bfloat16).eval()
    before = {k: v.clone() for k, v in model.named_parameters()}
    weights = native_lora("a", random_lora_state_dict(T2, rank=4, seed=3), model)
    fuse_into_weights(model, weights, 0.8)
    fuse_into_weights(model, weights, 0.8, sign=-1.0)
    changed = [k for k, v in model.named_parameters() if not torch.equal(v, before[k])]
    assert "blocks.0.attn.qkv_proj.weight" in changed


def test_hooks_come_off_when_the_body_raises():
    """An exception inside ``loras_applied`` still removes every hook."""
    model = H3Transformer(T2, dtype=torch.float32).eval()
    weights = native_lora("a", random_lora_state_dict(T2, rank=2, seed=4), model)
    with pytest.raises(RuntimeError):
        with loras_applied(model, [(weights, 1.0)]):
            raise RuntimeError("render failed")
    assert not any(m._forward_hooks for m in model.modules())


@pytest.mark.parametrize(
    "tamper, message",
    [
        (lambda sd: sd.update({"transformer.transformer_blocks.0.attn.to_z.lora_A.weight": torch.zeros(4, 96)}),
         "key transformer.transformer_blocks.0.attn.to_z.lora_A.weight names no module"),
        (lambda sd: sd.update({"transformer.transformer_blocks.0.norm1.lora_A.weight": torch.zeros(4, 96)}),
         "names no Linear of the DiT"),
        (lambda sd: sd.update({"transformer.transformer_blocks.0.attn.to_q.lora_B.weight": torch.zeros(128, 3)}),
         "rank mismatch at transformer_blocks.0.attn.to_q"),
        (lambda sd: sd.update({"transformer.transformer_blocks.0.attn.to_q.lora_A.weight": torch.zeros(4, 95)}),
         "shape mismatch at transformer_blocks.0.attn.to_q"),
        (lambda sd: sd.pop("transformer.transformer_blocks.1.ff.net.2.lora_B.weight"),
         "transformer_blocks.1.ff.net.2 has no lora_B"),
        (lambda sd: sd.update({"transformer.transformer_blocks.0.attn.to_q.alpha": torch.tensor(4.0)}),
         "is not a LoRA factor"),
    ],
    ids=["unknown-key", "norm-is-not-a-linear", "wrong-rank", "shape-mismatch", "lone-factor", "not-a-factor"],
)
def test_bad_adapter_is_refused_naming_the_key(tamper, message):
    """Each tampered adapter is refused with an AdapterError naming the key; nothing is hooked."""
    model = H3Transformer(T2, dtype=torch.float32).eval()
    state_dict = random_lora_state_dict(T2, rank=4, seed=5)
    tamper(state_dict)
    with pytest.raises(AdapterError, match=message):
        native_lora("bad", state_dict, model)
    assert not any(m._forward_hooks for m in model.modules())


def test_cache_is_an_lru_bounded_by_bytes():
    """Hits do not reload; the least recently used adapter is evicted when the byte budget is passed; an adapter larger
    than the whole budget is refused."""
    model = H3Transformer(T2, dtype=torch.float32).eval()
    made = {k: native_lora(k, random_lora_state_dict(T2, rank=4, seed=i), model) for i, k in enumerate("abc")}
    size = made["a"].nbytes
    cache = LoraCache(max_bytes=2 * size)
    cache.get("a", lambda: made["a"])
    cache.get("b", lambda: made["b"])
    cache.get("a", lambda: made["a"])  # hit: a is now the most recent
    assert cache.loads == 2
    cache.get("c", lambda: made["c"])
    assert cache.keys() == ["a", "c"] and cache.total_bytes == 2 * size
    with pytest.raises(AdapterError, match="exceed the LoRA cache"):
        LoraCache(max_bytes=size - 1).get("a", lambda: made["a"])


def test_worker_loras_apply_a_shared_set_once(tmp_path):
    """Adapters written by build-tiny-adapters, named as the API records them: two jobs of one set apply it once (the
    second changes nothing), another set swaps, an empty set leaves no hook and the base output bit-identical; each
    file is read once (LRU hit on the way back)."""
    from h3batch.worker.h3.adapters import WorkerLoras
    from h3batch.worker.h3.tiny_adapters import build_tiny_adapters

    build_tiny_adapters(tmp_path / "adapters")
    model = H3Transformer(T2, dtype=torch.float32).eval()
    inputs = t2va_inputs(T2)
    base = run(model, inputs)
    loras = WorkerLoras(model, max_bytes=1 << 20)
    style = [{"ref": "style", "scale": 0.7, "path": str(tmp_path / "adapters" / "lora-style")}]
    both = style + [{"ref": "char", "scale": 1.0, "path": str(tmp_path / "adapters" / "lora-character")}]
    loras.use(style)
    first = run(model, inputs)
    loras.use(list(style))
    assert loras.applies == 1 and torch.equal(run(model, inputs)[0], first[0])
    loras.use(both)
    assert loras.applies == 2 and not torch.equal(run(model, inputs)[0], first[0])
    loras.use(style)
    assert loras.applies == 3 and torch.equal(run(model, inputs)[0], first[0]) and loras.cache.loads == 2
    loras.use([])
    assert not any(m._forward_hooks for m in model.modules())
    assert torch.equal(run(model, inputs)[0], base[0])
