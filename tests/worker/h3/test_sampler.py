"""h3batch.worker.h3.sampler: §9 sigma ladders, Euler update (§13.16–17) and seeded noise (§13.18)."""
from __future__ import annotations

import pytest
import torch
from diffusers.schedulers import MiniMaxH3Scheduler
from diffusers.utils.torch_utils import randn_tensor

from h3batch.core.geometry import RequestGeometry
from h3batch.worker.h3.sampler import (
    AUDIO_SHIFT,
    NUM_FORWARDS,
    VIDEO_SHIFT,
    SigmaLadder,
    euler_step,
    initial_noise,
    shifted_sigmas,
)

# §9 table: k → (σ video f64, σ video f32, t video f32, σ audio f64, σ audio f32, t audio f32).
SIGMA_TABLE = [
    (0.9998999099189271, 0.9998998641967773, 1.0013580322265625e-4,
     0.9996664442961973, 0.9996663928031921, 3.3360719680786133e-4),
    (0.985788405143244, 0.9857883453369141, 0.014211654663085938,
     0.9541484716157204, 0.9541484117507935, 0.04585158824920654),
    (0.9675752486758817, 0.9675752520561218, 0.032424747943878174,
     0.8995196156925539, 0.8995195627212524, 0.10048043727874756),
    (0.94316807738815, 0.9431681036949158, 0.05683189630508423,
     0.8327402135231315, 0.8327401280403137, 0.16725987195968628),
    (0.9090909090909091, 0.9090909361839294, 0.09090906381607056, 0.75, 0.75, 0.25),
    (0.8571428571428571, 0.8571428656578064, 0.1428571343421936,
     0.6428571428571429, 0.6428571343421936, 0.3571428656578064),
    (0.7692307692307693, 0.7692307829856873, 0.23076921701431274, 0.5, 0.5, 0.5),
    (0.5882352941176471, 0.5882353186607361, 0.4117646813392639, 0.3, 0.30000001192092896, 0.699999988079071),
    (0.0, 0.0, None, 0.0, 0.0, None),
]

TINY_VIDEO = (1, 24, 7, 8, 16)
TINY_AUDIO = (74, 32)


def test_float64_sigmas_match_table():
    """The shift formula in float64 gives the table's f64 σ to 1e-12 for video (s=10) and audio (s=3)."""
    video = shifted_sigmas(VIDEO_SHIFT, dtype=torch.float64).tolist()
    audio = shifted_sigmas(AUDIO_SHIFT, dtype=torch.float64).tolist()
    assert video == pytest.approx([row[0] for row in SIGMA_TABLE], abs=1e-12, rel=0)
    assert audio == pytest.approx([row[3] for row in SIGMA_TABLE], abs=1e-12, rel=0)


def test_float32_ladder_and_times_bit_exact():
    """The runtime ladder (f32 arithmetic) and t = f32(1 − σ) equal the table's f32 values bit for bit."""
    ladder = SigmaLadder.v2()
    assert ladder.video_sigmas.dtype == ladder.audio_sigmas.dtype == torch.float32
    assert ladder.video_sigmas.tolist() == [row[1] for row in SIGMA_TABLE]
    assert ladder.audio_sigmas.tolist() == [row[4] for row in SIGMA_TABLE]
    for k in range(NUM_FORWARDS):
        assert ladder.timesteps(k) == (SIGMA_TABLE[k][2], SIGMA_TABLE[k][5])


def test_float32_arithmetic_differs_from_rounded_float64_where_spec_says():
    """f32 arithmetic is one ulp off round-to-f32(f64) exactly at video k=0,1 and audio k=0…3, equal elsewhere."""
    ladder = SigmaLadder.v2()
    video_rounded = shifted_sigmas(VIDEO_SHIFT, dtype=torch.float64).to(torch.float32)
    audio_rounded = shifted_sigmas(AUDIO_SHIFT, dtype=torch.float64).to(torch.float32)
    assert torch.nonzero(ladder.video_sigmas != video_rounded).flatten().tolist() == [0, 1]
    assert torch.nonzero(ladder.audio_sigmas != audio_rounded).flatten().tolist() == [0, 1, 2, 3]


def test_nine_nodes_eight_forwards():
    """The V2 ladder has 9 nodes ending at 0, strictly decreasing, and drives exactly 8 forwards."""
    ladder = SigmaLadder.v2()
    assert ladder.video_sigmas.numel() == ladder.audio_sigmas.numel() == 9
    assert ladder.num_steps == NUM_FORWARDS == 8
    with pytest.raises(IndexError, match="0 ≤ k < 8"):
        ladder.timesteps(8)


def test_ladder_rejects_bad_sigmas():
    """A ladder that does not decrease strictly to 0 or is not float32 is refused."""
    good = shifted_sigmas(VIDEO_SHIFT)
    with pytest.raises(ValueError, match="strictly decreasing"):
        SigmaLadder(torch.tensor([1.0, 0.5, 0.1]), good[:3])
    with pytest.raises(ValueError, match="float32"):
        SigmaLadder(good.double(), good)
    with pytest.raises(ValueError, match="equal length"):
        SigmaLadder(good, good[1:])


def test_scheduler_timesteps_agree_with_ladder():
    """diffusers' MiniMaxH3Scheduler given the explicit f32 ladders exposes the same 8 timesteps."""
    ladder = SigmaLadder.v2()
    for sigmas, which in ((ladder.video_sigmas, 0), (ladder.audio_sigmas, 1)):
        scheduler = MiniMaxH3Scheduler()
        scheduler.set_timesteps(sigmas=sigmas)
        assert scheduler.timesteps.tolist() == [ladder.timesteps(k)[which] for k in range(8)]


def test_euler_steps_bit_equal_to_scheduler():
    """Eight euler_step calls with random velocities equal the diffusers scheduler's step() bit for bit."""
    ladder = SigmaLadder.v2()
    gen = torch.Generator().manual_seed(3)
    for sigmas, shape in ((ladder.video_sigmas, TINY_VIDEO), (ladder.audio_sigmas, TINY_AUDIO)):
        scheduler = MiniMaxH3Scheduler()
        scheduler.set_timesteps(sigmas=sigmas)
        ours = theirs = torch.randn(shape, generator=gen)
        for k in range(8):
            v = torch.randn(shape, generator=gen)
            ours = euler_step(ours, v, k, sigmas)
            theirs = scheduler.step(v, scheduler.timesteps[k], theirs).prev_sample
            assert torch.equal(ours, theirs), k


def run_loop(x: torch.Tensor, sigmas: torch.Tensor, velocity) -> torch.Tensor:
    for k in range(sigmas.numel() - 1):
        t = float(1.0 - sigmas[k])
        x = euler_step(x, velocity(x, t), k, sigmas)
    return x


def ladder_and_pair(which: str, shape: tuple[int, ...], seed: int):
    """The V2 sigma ladder of `which` ("video" or "audio") and two unit-normal tensors of `shape` from `seed`."""
    ladder = SigmaLadder.v2()
    sigmas = ladder.video_sigmas if which == "video" else ladder.audio_sigmas
    gen = torch.Generator().manual_seed(seed)
    return sigmas, torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


@pytest.mark.parametrize("which, shape", [("video", TINY_VIDEO), ("audio", TINY_AUDIO)])
def test_oracle_velocity_returns_data(which, shape):
    """With v̂ = (x0 − x)/(1 − t) the 8-step loop from unit noise returns x0 to ≤ 1e-6 max-abs (§13.17)."""
    sigmas, x0, noise = ladder_and_pair(which, shape, seed=11)
    out = run_loop(noise, sigmas, lambda x, t: (x0 - x) / (1.0 - t))
    assert (out - x0).abs().max().item() <= 1e-6


@pytest.mark.parametrize("which, shape", [("video", TINY_VIDEO), ("audio", TINY_AUDIO)])
def test_fixed_velocity_on_trajectory_returns_data(which, shape):
    """With v̂ = x0 − ε starting on x = (1−σ0)·x0 + σ0·ε the loop returns x0 to ≤ 2e-6 max-abs (§13.17)."""
    sigmas, x0, eps = ladder_and_pair(which, shape, seed=12)
    start = (1 - sigmas[0]) * x0 + sigmas[0] * eps
    out = run_loop(start, sigmas, lambda x, t: x0 - eps)
    assert (out - x0).abs().max().item() <= 2e-6


@pytest.mark.parametrize("which, shape, one_minus_sigma0", [("video", TINY_VIDEO, 1.0014e-4),
                                                             ("audio", TINY_AUDIO, 3.336e-4)])
def test_fixed_velocity_from_raw_noise_keeps_residual(which, shape, one_minus_sigma0):
    """From raw unit noise the fixed velocity ends at x0 + (1 − σ0)·(ε − x0), a visible residual (σ0 < 1)."""
    sigmas, x0, eps = ladder_and_pair(which, shape, seed=13)
    assert 1 - sigmas[0].item() == pytest.approx(one_minus_sigma0, rel=1e-3)
    out = run_loop(eps.clone(), sigmas, lambda x, t: x0 - eps)
    expected = x0 + (1 - sigmas[0]) * (eps - x0)
    assert (out - expected).abs().max().item() <= 2e-6
    assert (out - x0).abs().max().item() > 2 * one_minus_sigma0


def test_last_step_returns_denoised_estimate():
    """At k = 7 (σ_8 = 0) the update returns x̂0 = x + (1 − t)·v exactly."""
    ladder = SigmaLadder.v2()
    x, v = torch.randn(TINY_AUDIO), torch.randn(TINY_AUDIO)
    one_minus_t = 1.0 - (1.0 - ladder.audio_sigmas[7])
    assert torch.equal(euler_step(x, v, 7, ladder.audio_sigmas), x + one_minus_t * v)


def test_euler_step_rejects_bad_inputs():
    """A non-fp32 state, mismatched velocity or out-of-range k raises."""
    sigmas = SigmaLadder.v2().video_sigmas
    x = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="float32"):
        euler_step(x.bfloat16(), x.bfloat16(), 0, sigmas)
    with pytest.raises(ValueError, match="velocity"):
        euler_step(x, torch.zeros(4, 2), 0, sigmas)
    with pytest.raises(IndexError):
        euler_step(x, x, 8, sigmas)


def test_noise_same_seed_identical_and_shapes():
    """The same seed gives identical fp32 noise of shapes [1,24,T,Hl,Wl] and [2A,32]; another seed differs."""
    geometry = RequestGeometry.from_frames(256, 128, 22, check_duration_window=False)
    video, audio = initial_noise(1234, geometry)
    again_video, again_audio = initial_noise(1234, geometry)
    assert video.shape == TINY_VIDEO and audio.shape == TINY_AUDIO
    assert video.dtype == audio.dtype == torch.float32
    assert torch.equal(video, again_video) and torch.equal(audio, again_audio)
    other_video, _ = initial_noise(1235, geometry)
    assert not torch.equal(video, other_video)


def test_noise_draw_order_video_then_audio_like_diffusers():
    """Video is drawn first and audio continues the same CPU generator, as diffusers' randn_tensor sequence does."""
    geometry = RequestGeometry.from_frames(256, 128, 22, check_duration_window=False)
    video, audio = initial_noise(42, geometry)
    generator = torch.Generator("cpu").manual_seed(42)
    want_video = randn_tensor(TINY_VIDEO, generator=generator, dtype=torch.float32)
    want_audio = randn_tensor(TINY_AUDIO, generator=generator, dtype=torch.float32)
    assert torch.equal(video, want_video) and torch.equal(audio, want_audio)
    fresh = torch.randn(TINY_AUDIO, generator=torch.Generator().manual_seed(42))
    assert not torch.equal(audio, fresh)  # not vllm-omni's fresh generator for audio


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, "7", True])
def test_noise_rejects_bad_seed(seed):
    """Seeds must be integers in [0, 2**64 − 1]."""
    geometry = RequestGeometry.from_frames(256, 128, 22, check_duration_window=False)
    with pytest.raises(ValueError, match="seed"):
        initial_noise(seed, geometry)


def test_ladder_step_advances_each_modality_on_its_own_sigmas():
    """SigmaLadder.step(k, …) equals euler_step with the video ladder for video and the audio ladder for audio."""
    ladder = SigmaLadder.v2()
    video, v_video = torch.randn(1, 56, 96), torch.randn(1, 56, 96)
    audio, v_audio = torch.randn(*TINY_AUDIO), torch.randn(*TINY_AUDIO)
    new_video, new_audio = ladder.step(3, video, v_video, audio, v_audio)
    assert torch.equal(new_video, euler_step(video, v_video, 3, ladder.video_sigmas))
    assert torch.equal(new_audio, euler_step(audio, v_audio, 3, ladder.audio_sigmas))
    assert not torch.equal(new_audio, euler_step(audio, v_audio, 3, ladder.video_sigmas))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_euler_step_on_cuda_bit_equal_to_cpu():
    """The Euler update on CUDA tensors (CPU ladder) gives the same fp32 bits as on CPU."""
    ladder = SigmaLadder.v2()
    x, v = torch.randn(TINY_VIDEO), torch.randn(TINY_VIDEO)
    for k in range(ladder.num_steps):
        cpu = euler_step(x, v, k, ladder.video_sigmas)
        gpu = euler_step(x.cuda(), v.cuda(), k, ladder.video_sigmas)
        assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu), k
