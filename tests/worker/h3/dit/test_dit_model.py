"""Native DiT forward: parity with diffusers' MiniMaxH3Transformer3DModel and the forward invariants of §13.8-13.13."""

import math

import pytest
import torch

from h3batch.worker.h3.config import T1, T2, H3Config
from h3batch.worker.h3.loader import load_diffusers_weights
from h3batch.worker.h3.model import H3Transformer, RotaryEmbedding, apply_rope, timestep_sinusoid
from tests.worker.h3.dit.dit_oracle import (
    gate_tensors,
    make_oracle,
    oracle_forward,
    oracle_to_mixed_bf16,
    t2va_inputs,
)

FP32_ATOL = 1e-4  # spec §13.3 asks ~1e-6; fp32 eager math here matches the oracle op for op
BF16_ATOL = 5e-2  # spec §13.3, velocities of unit scale


def native_from_oracle(config: H3Config, oracle, dtype=torch.float32, gates: dict | None = None) -> H3Transformer:
    """Native model with the oracle's weights (plus the given Diffusers-named gates, which enable them)."""
    model = H3Transformer(config.with_gates(gates is not None), dtype=dtype).eval()
    load_diffusers_weights(model, {**oracle.state_dict(), **(gates or {})})
    return model


def run(model: H3Transformer, inputs, **extra) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return model(**inputs.kwargs(), **extra)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.fixture(scope="module")
def t2_pair():
    """A random T2 oracle (fp32) and the native fp32 model loaded from it with zero gates (dense V2 layout)."""
    oracle = make_oracle(T2, seed=0)
    return oracle, native_from_oracle(T2, oracle, gates=gate_tensors(T2, seed=None))


# Parity with the diffusers oracle ------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [T1, T2], ids=["T1", "T2"])
def test_fp32_parity_with_diffusers(config):
    """fp32 native outputs equal the diffusers oracle's on identical random weights (both heads, ≤ 1e-4)."""
    oracle = make_oracle(config, seed=0)
    inputs = t2va_inputs(config, batch=2)
    expected_video, expected_audio = oracle_forward(oracle, inputs)
    video, audio = run(native_from_oracle(config, oracle, gates=gate_tensors(config, seed=None)), inputs)
    assert expected_video.std() > 0.5 and expected_audio.std() > 0.5  # non-trivial outputs
    assert max_diff(video, expected_video) <= FP32_ATOL
    assert max_diff(audio, expected_audio) <= FP32_ATOL


def test_fp32_kernel_free_parts_match_diffusers(t2_pair):
    """Refiner (with condition projection), time embedding and RoPE tables equal the oracle's parts in fp32."""
    oracle, model = t2_pair
    inputs = t2va_inputs(T2, batch=2)
    with torch.no_grad():
        refined = model.refine_text(inputs.encoder_hidden_states)
        expected_refined = oracle.token_refiner(oracle.context_embedder(inputs.encoder_hidden_states))
        temb = model.time_embedder(inputs.timestep)
        expected_temb = oracle.time_embedder(oracle.time_proj(inputs.timestep))
    assert max_diff(refined, expected_refined) <= 1e-6
    assert max_diff(temb, expected_temb) <= 1e-6
    for got, expected in zip(model.rope(inputs.position_ids), oracle.rope(inputs.position_ids)):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("config", [T1, T2], ids=["T1", "T2"])
def test_bf16_parity_with_diffusers(config):
    """bf16 native (fp32 boundary modules) vs the mixed-precision bf16 oracle: both heads within 5e-2."""
    oracle = make_oracle(config, seed=0)
    inputs = t2va_inputs(config)
    native = native_from_oracle(config, oracle, dtype=torch.bfloat16)
    expected_video, expected_audio = oracle_forward(oracle_to_mixed_bf16(oracle), inputs)
    video, audio = run(native, inputs)
    assert max_diff(video, expected_video) <= BF16_ATOL
    assert max_diff(audio, expected_audio) <= BF16_ATOL


def test_output_shapes_and_dtypes():
    """A bf16 model returns fp32 [B, Nv, 96] video and [B, Na, 32] audio velocities."""
    model = H3Transformer(T2).eval()
    inputs = t2va_inputs(T2, batch=2)
    video, audio = run(model, inputs)
    assert video.shape == (2, 18, 96) and audio.shape == (2, 10, 32)
    assert video.dtype == audio.dtype == torch.float32
    assert torch.isfinite(video).all() and torch.isfinite(audio).all()


def test_fp32_state_after_load_is_boundary_only(t2_pair):
    """A bf16 model loaded from fp32 weights keeps exactly 12 fp32 tensors + rope.inv_freq."""
    oracle, _ = t2_pair
    model = native_from_oracle(T2, oracle, dtype=torch.bfloat16)
    fp32 = [n for n, t in model.state_dict().items() if t.dtype == torch.float32]
    assert len(fp32) == 13 and "rope.inv_freq" in fp32


# Forward invariants --------------------------------------------------------------------------------------------------


def test_row_permutation_equivariance(t2_pair):
    """Permuting packed rows with their positions, tags, timestep indices and index tensors leaves outputs unchanged."""
    _, model = t2_pair
    inputs = t2va_inputs(T2)
    rows = inputs.position_ids.shape[0]
    perm = torch.randperm(rows, generator=torch.Generator().manual_seed(5))  # new row r holds old row perm[r]
    new_slot = torch.empty_like(perm)
    new_slot[perm] = torch.arange(rows)
    permuted = t2va_inputs(T2)
    permuted.position_ids = inputs.position_ids[perm]
    permuted.token_tags = inputs.token_tags[perm]
    permuted.timestep_indices = inputs.timestep_indices[perm]
    permuted.video_indices = new_slot[inputs.video_indices]
    permuted.audio_indices = new_slot[inputs.audio_indices]
    permuted.text_indices = new_slot[inputs.text_indices]
    for got, expected in zip(run(model, permuted), run(model, inputs)):
        assert max_diff(got, expected) <= 1e-5


def test_duplicated_timestep_value_is_invariant(t2_pair):
    """Appending a copy of t_v to `timestep` and pointing the video rows at it changes nothing."""
    _, model = t2_pair
    inputs = t2va_inputs(T2)
    duplicated = t2va_inputs(T2)
    duplicated.timestep = torch.cat((inputs.timestep, inputs.timestep[:1]))
    duplicated.timestep_indices = torch.where(inputs.token_tags == 0, 2, inputs.timestep_indices)
    for got, expected in zip(run(model, duplicated), run(model, inputs)):
        assert max_diff(got, expected) <= 1e-6


def test_timestep_changes_outputs(t2_pair):
    """A different audio time changes the outputs (timestep conditioning is live)."""
    _, model = t2_pair
    inputs = t2va_inputs(T2)
    shifted = t2va_inputs(T2, t_audio=0.9)
    assert max_diff(run(model, shifted)[1], run(model, inputs)[1]) > 1e-3


def test_timestep_sinusoid_is_cos_first_and_unscaled():
    """e(t) = [cos(t·ω) | sin(t·ω)] with ω_0 = 1 and t used as given in [0, 1] (never ×1000)."""
    t = torch.tensor([0.0, 0.5])
    embedding = timestep_sinusoid(t, 16)
    assert torch.equal(embedding[0], torch.cat((torch.ones(8), torch.zeros(8))))
    omega = torch.exp(-math.log(10000.0) * torch.arange(8) / 8)
    torch.testing.assert_close(embedding[1], torch.cat((torch.cos(0.5 * omega), torch.sin(0.5 * omega))))


def test_zero_adaln_makes_block_stack_identity(t2_pair):
    """With all block AdaLN weights and biases zero, the bf16 outputs equal those of a model with no blocks."""
    oracle, _ = t2_pair
    model = native_from_oracle(T2, oracle, dtype=torch.bfloat16)
    with torch.no_grad():
        for block in model.blocks:
            block.adaln_proj.linear.weight.zero_()
            block.adaln_proj.linear.bias.zero_()
    inputs = t2va_inputs(T2)
    stacked = run(model, inputs)
    model.blocks = torch.nn.ModuleList()
    for got, expected in zip(stacked, run(model, inputs)):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("modality", [0, 1, 2])
def test_adaln_bias_slice_modulates_only_its_modality(t2_pair, modality):
    """A bias only in slice [6mH, 6(m+1)H) of block 0's AdaLN changes norm1's output only on rows tagged m."""
    oracle, _ = t2_pair
    model = native_from_oracle(T2, oracle)
    captured = []
    model.blocks[0].attn.register_forward_pre_hook(lambda module, args: captured.append(args[0].clone()))
    linear = model.blocks[0].adaln_proj.linear
    hidden = T2.hidden_size
    inputs = t2va_inputs(T2)
    with torch.no_grad():
        linear.weight.zero_()
        linear.bias.zero_()
        run(model, inputs)
        linear.bias[6 * modality * hidden : 6 * (modality + 1) * hidden] = 0.5
        run(model, inputs)
    changed_rows = (captured[0] != captured[1]).any(dim=-1)[0]  # [S]
    assert torch.equal(changed_rows, inputs.token_tags == modality)


def test_final_adaln_is_shift_first(t2_pair):
    """With the final AdaLN weight zero, a bias in the first half shifts every row by video_out(shift) only."""
    oracle, _ = t2_pair
    model = native_from_oracle(T2, oracle)
    final = model.final_layer
    inputs = t2va_inputs(T2)
    with torch.no_grad():
        final.adaln_proj.linear.weight.zero_()
        final.adaln_proj.linear.bias.zero_()
        base_video, _ = run(model, inputs)
        shift = torch.linspace(-1, 1, T2.hidden_size)
        final.adaln_proj.linear.bias[: T2.hidden_size] = shift
        shifted_video, _ = run(model, inputs)
        expected = shift @ final.video_out.weight.T  # [96]
    torch.testing.assert_close(shifted_video - base_video, expected.expand_as(base_video), rtol=0, atol=1e-5)


def test_batch_of_two_equals_two_single_runs(t2_pair):
    """B = 2 with different inputs equals two B = 1 runs (each batch item is its own attention document)."""
    _, model = t2_pair
    pair = t2va_inputs(T2, batch=2, seed=11)
    video, audio = run(model, pair)
    for b in range(2):
        single = t2va_inputs(T2, batch=1, seed=11)
        single.hidden_states = pair.hidden_states[b : b + 1]
        single.audio_hidden_states = pair.audio_hidden_states[b : b + 1]
        single.encoder_hidden_states = pair.encoder_hidden_states[b : b + 1]
        single_video, single_audio = run(model, single)
        assert max_diff(single_video, video[b : b + 1]) <= 1e-5
        assert max_diff(single_audio, audio[b : b + 1]) <= 1e-5


def test_refiner_is_timestep_and_latent_independent(t2_pair):
    """The refiner output does not change with timestep or video/audio rows; passing it precomputed gives the same."""
    _, model = t2_pair
    captured = []
    model.token_refiner.register_forward_hook(lambda module, args, out: captured.append(out.clone()))
    first = t2va_inputs(T2, seed=1, t_video=0.1, t_audio=0.3)
    second = t2va_inputs(T2, seed=2, t_video=0.6, t_audio=0.7)
    second.encoder_hidden_states = first.encoder_hidden_states
    full = run(model, first)
    run(model, second)
    model._forward_hooks.clear()
    model.token_refiner._forward_hooks.clear()
    assert torch.equal(captured[0], captured[1])
    with torch.no_grad():
        refined = model.refine_text(first.encoder_hidden_states)
        kwargs = first.kwargs() | {"encoder_hidden_states": None}
        reused = model(**kwargs, refined_text=refined)
    for got, expected in zip(reused, full):
        assert torch.equal(got, expected)


def test_text_row_rope_leaves_h_w_pairs_and_tail_unrotated():
    """Text positions (k, 0, 0) rotate only the t pairs; channels ≥ 6n are never rotated, for any position."""
    rope = RotaryEmbedding(T2)
    n = T2.rope_inv_freq_len  # pairs (i, i + 3n): t for i < n, h for n ≤ i < 2n, w for 2n ≤ i < 3n
    x = torch.randn(1, 5, 2, T2.attention_head_dim)
    text_positions = torch.tensor([[k, 0.0, 0.0] for k in range(5)], dtype=torch.float64)
    rotated = apply_rope(x, *rope(text_positions))
    unrotated = [c for i in range(n, 3 * n) for c in (i, i + 3 * n)] + list(range(6 * n, T2.attention_head_dim))
    assert torch.equal(rotated[..., unrotated], x[..., unrotated])
    assert not torch.equal(rotated[:, 1:, :, :n], x[:, 1:, :, :n])
    any_positions = torch.randn(5, 3, dtype=torch.float64) * 30
    assert torch.equal(apply_rope(x, *rope(any_positions))[..., 6 * n :], x[..., 6 * n :])


def test_sparse_path_dense_plan_with_zero_gates_equals_dense(t2_pair):
    """A VSA plan with sparsity 0 (k = Nv) and zero gates gives the dense outputs; random gates change them."""
    from h3batch.worker.h3.vsa_plan import build_vsa_plan

    oracle, model = t2_pair
    inputs = t2va_inputs(T2, latent_frames=5)  # video grid (5, 2, 3): two (4,4,4) tiles
    plan = build_vsa_plan((7, 10), (5, 2, 3), sparsity=0.0)
    dense = run(model, inputs)
    for got, expected in zip(run(model, inputs, vsa_plan=plan), dense):
        assert max_diff(got, expected) <= 1e-5
    gated = native_from_oracle(T2, oracle, gates=gate_tensors(T2, seed=2))
    sparse = build_vsa_plan((7, 10), (5, 2, 3), sparsity=0.8)
    assert sparse.top_k == 1 and sparse.num_video_tiles == 2
    assert max_diff(run(gated, inputs, vsa_plan=sparse)[0], dense[0]) > 1e-3
    for got, expected in zip(run(gated, inputs), dense):  # gates are unused on the dense path
        assert torch.equal(got, expected)


def test_sparse_path_without_gates_passes_zero_gates(t2_pair):
    """A gate-less model on the sparse path equals the gated model whose gates are zero."""
    oracle, zero_gated = t2_pair
    plain = native_from_oracle(T2, oracle)
    from h3batch.worker.h3.vsa_plan import build_vsa_plan

    plan = build_vsa_plan((7, 10), (5, 2, 3), sparsity=0.8)
    inputs = t2va_inputs(T2, latent_frames=5)
    for got, expected in zip(run(plain, inputs, vsa_plan=plan), run(zero_gated, inputs, vsa_plan=plan)):
        assert torch.equal(got, expected)


def test_attention_core_sends_cpu_tensors_with_a_plan_to_the_reference():
    """`AttentionCore` with a VSA plan on CPU tensors returns exactly the dense-mask reference, not dense SDPA."""
    from h3batch.worker.h3.model import AttentionCore
    from h3batch.worker.h3.vsa import vsa_attention_reference
    from h3batch.worker.h3.vsa_plan import build_vsa_plan

    plan = build_vsa_plan((7, 10), (5, 4, 8), sparsity=0.8)
    assert not plan.is_dense
    q, k, v, gate = torch.randn(4, 1, plan.sequence_length, 2, 16, generator=torch.Generator().manual_seed(3))
    core = AttentionCore(head_dim=16)
    out = core(q, k, v, gate, plan)
    assert torch.equal(out, vsa_attention_reference(q, k, v, gate, plan))
    assert max_diff(out, core(q, k, v, None)) > 1e-3  # the sparse path is not the dense one


# Input validation ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("position_ids", torch.zeros(35, 2), r"position_ids must be \(S, 3\), got \[35, 2\]"),
        ("token_tags", torch.zeros(34, dtype=torch.long), r"must both be \(35,\).*\[34\] and \[35\]"),
        ("hidden_states", torch.zeros(1, 18, 95), r"hidden_states must be \[B, Nv, 96\], got \[1, 18, 95\]"),
        ("audio_hidden_states", torch.zeros(2, 10, 32), r"audio_hidden_states must be \[1, Na, 32\]"),
        ("encoder_hidden_states", torch.zeros(1, 7, 81), r"encoder_hidden_states must be \[1, L, 80\]"),
        ("video_indices", torch.arange(17), r"video_indices must be \(18,\).*got \[17\]"),
        ("timestep", torch.zeros(2, 1), r"timestep must be a non-empty 1-D"),
    ],
)
def test_bad_input_shapes_are_refused(t2_pair, field, value, message):
    """Each malformed argument raises ValueError quoting the expected and received shapes."""
    _, model = t2_pair
    inputs = t2va_inputs(T2)
    setattr(inputs, field, value)
    with pytest.raises(ValueError, match=message):
        run(model, inputs)


def test_row_counts_must_cover_the_sequence(t2_pair):
    """Video + audio + text rows that do not add up to S are refused."""
    _, model = t2_pair
    inputs = t2va_inputs(T2)
    inputs.encoder_hidden_states = inputs.encoder_hidden_states[:, :6]
    inputs.text_indices = inputs.text_indices[:6]
    with pytest.raises(ValueError, match="must equal S = 35"):
        run(model, inputs)
