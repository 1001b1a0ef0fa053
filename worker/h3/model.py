"""The MiniMax-H3 DiT in native (N) names: one packed sequence, 50 AdaLN blocks, two output heads.

Math and dtypes follow spec h3-model.md §4.3 and the diffusers oracle ``MiniMaxH3Transformer3DModel`` (same forward
signature, same outputs). Differences from the oracle, all layout or speed, none numerical by design:

* N names (``qkv_proj`` packed ``[Q; K; V]``, gate-first SwiGLU ``fc1 = [gate; up]``) so a tensor-parallel pass can
  shard the model after construction; ``worker/h3/loader.py`` maps Diffusers checkpoints onto them.
* Every AdaLN modulation point goes through the fused ops of ``kernels`` (Triton on GPU, eager reference on CPU).
* The text refiner is timestep-independent, so ``refine_text`` can run once per request and its output be passed to
  every step as ``refined_text``.
* The output heads run on the selected video / audio rows only (the oracle runs both heads on all S rows).
* ``vsa_plan`` switches the 50 DiT blocks to VSA-H3 sparse attention (``worker/h3/vsa_plan.py``,
  ``vsa.py``, ``vsa_cuda.py``); the refiner stays dense.
* Two seams for parallelism applied after construction (``worker/h3/parallel.py``): ``Attention.core`` is a
  parameter-free module a plan can swap, and ``embed`` returns the packed stream before the first block.

Dtypes: positions, RoPE angles, the patch projections, the time MLP and the output heads are fp32; the block stack,
the condition projection and the AdaLN projections use the stream dtype (bf16 in service), evaluated eagerly so every
elementwise op rounds to it. No autocast.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from h3batch.kernels import (
    indexed_gate,
    indexed_gate_rms_norm_scale_shift,
    indexed_scale_shift_,
    qk_norm_rope,
    rms_norm_indexed_scale_shift,
    swiglu,
)
from h3batch.worker.h3.config import MODALITY_COUNT, H3Config

# Modules whose parameters stay fp32 whatever the stream dtype (the checkpoint stores them fp32), plus the RoPE buffer.
FP32_MODULES = (
    "video_patch_proj",
    "audio_patch_proj",
    "time_embedder",
    "rope",
    "final_layer.video_out",
    "final_layer.audio_out",
)

# Row tags of the packed sequence.
TAG_VIDEO, TAG_TEXT, TAG_AUDIO = 0, 1, 2

RopeTables = tuple[torch.Tensor, torch.Tensor]


# Position and time encodings ---------------------------------------------------------------------------------------


def rope_inv_freq(length: int, theta: float) -> torch.Tensor:
    """``1 / theta ** (arange(0, 2n, 2) / 2n)`` with n = length, on CPU in fp32 (§3.4); shared by t, h, w. [n]"""
    exponents = torch.arange(0, 2 * length, 2, dtype=torch.float32, device="cpu") / (2 * length)
    return 1.0 / (theta**exponents)


class RotaryEmbedding(nn.Module):
    """Holds ``inv_freq`` and turns (t, h, w) positions into fp32 cos/sin tables [S, 6n]."""

    def __init__(self, config: H3Config):
        super().__init__()
        # Persistent, so the native state dict carries it (535 keys); fp32 always.
        inv_freq = rope_inv_freq(config.rope_inv_freq_len, config.rope_theta)
        self.register_buffer("inv_freq", inv_freq.to(torch.get_default_device()))

    def forward(self, position_ids: torch.Tensor) -> RopeTables:
        positions = position_ids.to(torch.float32)  # [S, 3], float64 in -> fp32 here, as the oracle does
        angles = (positions[:, :, None] * self.inv_freq.view(1, 1, -1)).flatten(1)  # [S, 3n]: t | h | w blocks
        angles = torch.cat((angles, angles), dim=-1)  # [S, 6n]: rotate-half pairs (i, i + 3n)
        return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channels [0, 6n) of each head with the rotate-half convention; channels >= 6n pass through.

    x: [B, S, heads, head_dim]; cos, sin: [S, 6n] fp32, cast to x's dtype first (as the oracle does).
    """
    width = cos.shape[-1]
    half = width // 2
    cos = cos.to(x.dtype)[None, :, None, :]
    sin = sin.to(x.dtype)[None, :, None, :]
    rotary, passthrough = x[..., :width], x[..., width:]
    rotated_half = torch.cat((-rotary[..., half:], rotary[..., :half]), dim=-1)
    return torch.cat((rotary * cos + rotated_half * sin, passthrough), dim=-1)


def timestep_sinusoid(timestep: torch.Tensor, width: int, max_period: float = 10000.0) -> torch.Tensor:
    """Cos-first sinusoid of the unscaled clean time t in [0, 1]: [cos(t w_j) | sin(t w_j)], w_j = e^(-ln(P) j/half).

    timestep: [M] -> [M, width] fp32.
    """
    half = width // 2
    exponents = -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=timestep.device) / half
    angles = timestep.to(torch.float32)[:, None] * torch.exp(exponents)[None, :]
    embedding = torch.cat((angles.cos(), angles.sin()), dim=-1)
    if width % 2:
        embedding = F.pad(embedding, (0, 1))
    return embedding


class TimestepEmbedder(nn.Module):
    """Sinusoid -> Linear -> SiLU -> Linear, in fp32: [M] -> temb [M, time_embed_dim]."""

    def __init__(self, config: H3Config):
        super().__init__()
        self.width = config.timestep_input_dim
        self.proj_in = nn.Linear(config.timestep_input_dim, config.time_embed_hidden_size, dtype=torch.float32)
        self.proj_out = nn.Linear(config.time_embed_hidden_size, config.time_embed_dim, dtype=torch.float32)

    def forward(self, timestep: torch.Tensor) -> torch.Tensor:
        embedding = timestep_sinusoid(timestep, self.width).to(self.proj_in.weight.dtype)
        return self.proj_out(F.silu(self.proj_in(embedding)))


class AdaLNProjection(nn.Module):
    """``linear(silu(temb))``: SiLU at temb's precision (fp32), cast to the projection's dtype after the activation."""

    def __init__(self, time_embed_dim: int, out_features: int, dtype: torch.dtype):
        super().__init__()
        self.linear = nn.Linear(time_embed_dim, out_features, dtype=dtype)

    def forward(self, temb: torch.Tensor) -> torch.Tensor:
        return self.linear(F.silu(temb).to(self.linear.weight.dtype))


# Blocks --------------------------------------------------------------------------------------------------------------


class AttentionCore(nn.Module):
    """softmax(q·kᵀ/√d)·v over the rows it is given: dense SDPA, or VSA-H3 when a plan is passed. No parameters.

    With a plan, CUDA tensors take worker/h3/vsa_tk.py (the sm_90a kernel, else FlexAttention in vsa_cuda.py) and all
    others the dense-mask reference (worker/h3/vsa.py); neither ever falls back to dense attention.

    Its own module so a parallel plan can swap it after construction (worker/h3/parallel.py wraps it in the Ulysses
    all-to-all); the projections around it never change.
    """

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim

    def forward(
        self,
        q: torch.Tensor,  # [B, S, heads, hd], after QK-norm and RoPE
        k: torch.Tensor,  # [B, S, heads, hd]
        v: torch.Tensor,  # [B, S, heads, hd]
        gate: torch.Tensor | None,  # [B, S, heads, hd] VSA coarse-branch gate; only read with a plan
        vsa_plan: Any = None,
    ) -> torch.Tensor:
        if vsa_plan is None:
            return F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=1.0 / math.sqrt(self.head_dim)
            ).transpose(1, 2)  # [B, S, heads, hd]
        # VSA imports are lazy so the dense model needs neither. CUDA: the compiled sm_90a kernel where it loads
        # (vsa_tk.use_tk decides), else block-sparse FlexAttention (vsa_cuda, compiled on first use).
        if q.is_cuda:
            from h3batch.worker.h3.vsa_tk import vsa_attention_fast

            return vsa_attention_fast(q, k, v, gate, vsa_plan)  # [B, S, heads, hd]
        from h3batch.worker.h3.vsa import vsa_attention_reference

        return vsa_attention_reference(q, k, v, gate, vsa_plan)  # [B, S, heads, hd]


class Attention(nn.Module):
    """Self-attention over the packed sequence: packed QKV, per-head QK RMSNorm, partial 3-axis RoPE, SDPA or VSA-H3."""

    def __init__(self, config: H3Config, dtype: torch.dtype, *, compression_gate: bool):
        super().__init__()
        hidden, inner = config.hidden_size, config.inner_dim
        self.head_dim = config.attention_head_dim
        self.qkv_proj = nn.Linear(hidden, 3 * inner, bias=False, dtype=dtype)  # rows [Q; K; V]
        self.q_norm = nn.RMSNorm(self.head_dim, eps=config.qk_norm_eps, dtype=dtype)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=config.qk_norm_eps, dtype=dtype)
        self.core = AttentionCore(self.head_dim)
        self.out_proj = nn.Linear(inner, hidden, bias=False, dtype=dtype)
        self.to_gate_compress: nn.Linear | None = None
        if compression_gate:
            # V2 learned gate of VSA's coarse branch; zero = no coarse branch. Loading overwrites it.
            self.to_gate_compress = nn.Linear(hidden, inner, bias=False, dtype=dtype)
            nn.init.zeros_(self.to_gate_compress.weight)

    def forward(self, h: torch.Tensor, rope: RopeTables | None = None, vsa_plan: Any = None) -> torch.Tensor:
        batch, rows, _ = h.shape  # h: [B, S, H]
        # Heads come from the weight's rows, so a head-sharded qkv_proj ([Q_local; K_local; V_local]) also works.
        qkv = self.qkv_proj(h)  # [B, S, 3 * heads * hd]
        v = qkv.view(batch, rows, 3, -1, self.head_dim)[:, :, 2]  # [B, S, heads, hd] view
        # Per-head RMSNorm + RoPE of q and k in one fused op (kernels/qk_norm_rope.py; eager on CPU): same
        # roundings as self.q_norm / self.k_norm followed by apply_rope. q_norm and k_norm share qk_norm_eps.
        q, k = qk_norm_rope(qkv, self.head_dim, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, rope)
        gate = None
        if vsa_plan is not None:
            if self.to_gate_compress is None:
                gate = torch.zeros_like(q)
            else:
                gate = self.to_gate_compress(h).view(batch, rows, -1, self.head_dim)
        out = self.core(q, k, v, gate, vsa_plan)  # [B, S, heads, hd]
        return self.out_proj(out.reshape(batch, rows, -1))


class SwiGLU(nn.Module):
    """``fc2(silu(gate) * up)`` with ``fc1`` rows ``[gate; up]`` (gate first; Diffusers stores value first)."""

    def __init__(self, config: H3Config, dtype: torch.dtype):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, 2 * config.ffn_hidden_size, bias=False, dtype=dtype)
        self.fc2 = nn.Linear(config.ffn_hidden_size, config.hidden_size, bias=False, dtype=dtype)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc2(swiglu(self.fc1(h)))  # silu(gate) * up, fused on CUDA (kernels/swiglu.py)


class RefinerBlock(nn.Module):
    """Plain pre-norm block on the text rows alone: no AdaLN, no RoPE, dense attention."""

    def __init__(self, config: H3Config, dtype: torch.dtype):
        super().__init__()
        self.norm1 = nn.RMSNorm(config.hidden_size, eps=config.norm_eps, dtype=dtype)
        self.attn = Attention(config, dtype, compression_gate=False)
        self.norm2 = nn.RMSNorm(config.hidden_size, eps=config.norm_eps, dtype=dtype)
        self.mlp = SwiGLU(config, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TokenRefiner(nn.Module):
    def __init__(self, config: H3Config, dtype: torch.dtype):
        super().__init__()
        self.blocks = nn.ModuleList(RefinerBlock(config, dtype) for _ in range(config.token_refiner_num_layers))
        self.final_norm = nn.RMSNorm(config.hidden_size, eps=config.final_norm_eps, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x)


class DiTBlock(nn.Module):
    """Pre-norm attention + SwiGLU, each modulated per row from a [3M, 6H] (timestep, modality) AdaLN table."""

    def __init__(self, config: H3Config, dtype: torch.dtype):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.norm1 = nn.RMSNorm(config.hidden_size, eps=config.norm_eps, dtype=dtype)
        self.attn = Attention(config, dtype, compression_gate=config.vsa_gates)
        self.norm2 = nn.RMSNorm(config.hidden_size, eps=config.norm_eps, dtype=dtype)
        self.mlp = SwiGLU(config, dtype)
        self.adaln_proj = AdaLNProjection(config.time_embed_dim, config.adaln_out_features, dtype)

    def forward(
        self,
        x: torch.Tensor,  # [B, S, H] stream dtype
        temb: torch.Tensor,  # [M, time_embed_dim] fp32
        adaln_rows: torch.Tensor,  # [S] long: 3 * timestep_index + tag, shared by the batch items
        rope: RopeTables,
        vsa_plan: Any = None,
    ) -> torch.Tensor:
        hidden = x.shape[-1]
        # [M, 18H] -> [3M, 6H]: table row 3*tau + modality; six [3M, H] row views with stride 6H.
        tables = self.adaln_proj(temb).view(-1, 6 * hidden)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = tables.chunk(6, dim=-1)
        h = rms_norm_indexed_scale_shift(x, self.norm1.weight, shift_msa, scale_msa, adaln_rows, self.norm1.eps)
        attn = self.attn(h, rope, vsa_plan)
        x, h = indexed_gate_rms_norm_scale_shift(
            x, gate_msa, attn, self.norm2.weight, shift_mlp, scale_mlp, adaln_rows, self.norm2.eps
        )
        return indexed_gate(x, gate_mlp, self.mlp(h), adaln_rows)


class FinalLayer(nn.Module):
    """RMSNorm, shift-first AdaLN indexed by timestep index (not modality), fp32 video and audio heads."""

    def __init__(self, config: H3Config, dtype: torch.dtype):
        super().__init__()
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.final_norm_eps, dtype=dtype)
        self.adaln_proj = AdaLNProjection(config.time_embed_dim, config.final_adaln_out_features, dtype)
        self.video_out = nn.Linear(config.hidden_size, config.video_patch_dim, dtype=torch.float32)
        self.audio_out = nn.Linear(config.hidden_size, config.audio_latents_dim, dtype=torch.float32)

    def forward(
        self,
        x: torch.Tensor,  # [B, S, H]
        temb: torch.Tensor,  # [M, time_embed_dim]
        timestep_indices: torch.Tensor,  # [S] long, timestep index per row
        video_indices: torch.Tensor,  # [Nv]
        audio_indices: torch.Tensor,  # [Na]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.modulate(x, temb, timestep_indices)
        video = self.video_out(y.index_select(1, video_indices))  # [B, Nv, P]
        audio = self.audio_out(y.index_select(1, audio_indices))  # [B, Na, Ca]
        return video, audio

    def modulate(self, x: torch.Tensor, temb: torch.Tensor, timestep_indices: torch.Tensor) -> torch.Tensor:
        """RMSNorm + shift-first AdaLN of every row, cast for the fp32 heads: [B, S, H] -> [B, S, H] fp32."""
        shift, scale = self.adaln_proj(temb).chunk(2, dim=-1)  # [M, H] each, shift first
        y = indexed_scale_shift_(self.norm(x), shift, scale, timestep_indices)
        return y.to(self.video_out.weight.dtype)


# Model ---------------------------------------------------------------------------------------------------------------


class H3Transformer(nn.Module):
    """MiniMax-H3 DiT. ``forward`` has the diffusers oracle's signature and returns (video_v, audio_v) in fp32."""

    def __init__(self, config: H3Config, *, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.video_patch_proj = nn.Linear(config.video_patch_dim, hidden, dtype=torch.float32)
        self.audio_patch_proj = nn.Linear(config.audio_latents_dim, hidden, dtype=torch.float32)
        self.condition_proj = nn.Linear(config.text_dim, hidden, dtype=dtype)
        self.time_embedder = TimestepEmbedder(config)
        self.rope = RotaryEmbedding(config)
        self.token_refiner = TokenRefiner(config, dtype)
        self.blocks = nn.ModuleList(DiTBlock(config, dtype) for _ in range(config.num_layers))
        self.final_layer = FinalLayer(config, dtype)

    @property
    def stream_dtype(self) -> torch.dtype:
        """dtype of the packed residual stream (the condition projection's, as in the oracle)."""
        return self.condition_proj.weight.dtype

    def refine_text(self, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        """Condition projection + token refiner: [B, L, text_dim] -> [B, L, H]. Timestep-independent."""
        if encoder_hidden_states.ndim != 3 or encoder_hidden_states.shape[-1] != self.config.text_dim:
            raise ValueError(
                f"encoder_hidden_states must be [B, L, {self.config.text_dim}], "
                f"got {list(encoder_hidden_states.shape)}"
            )
        text = self.condition_proj(encoder_hidden_states.to(self.condition_proj.weight.dtype))
        return self.token_refiner(text)

    def forward(
        self,
        hidden_states: torch.Tensor,  # [B, Nv, P] video rows in video_indices order
        audio_hidden_states: torch.Tensor,  # [B, Na, Ca] audio rows in audio_indices order
        encoder_hidden_states: torch.Tensor | None,  # [B, L, text_dim]; may be None when refined_text is given
        timestep: torch.Tensor,  # [M] distinct clean times in [0, 1], unscaled
        timestep_indices: torch.Tensor,  # [S] long
        token_tags: torch.Tensor,  # [S] long: 0 video, 1 text, 2 audio
        position_ids: torch.Tensor,  # [S, 3] (t, h, w), float64 accepted
        video_indices: torch.Tensor,  # [Nv] long
        audio_indices: torch.Tensor,  # [Na] long
        text_indices: torch.Tensor,  # [L] long
        *,
        vsa_plan: Any = None,  # h3batch.worker.h3.vsa_plan.VsaPlan: VSA-H3 in the DiT blocks; None = dense SDPA
        refined_text: torch.Tensor | None = None,  # [B, L, H] from refine_text(); used instead of the text input
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, temb, adaln_rows, rope = self.embed(
            hidden_states, audio_hidden_states, encoder_hidden_states, timestep, timestep_indices, token_tags,
            position_ids, video_indices, audio_indices, text_indices, refined_text=refined_text,
        )
        for block in self.blocks:
            x = block(x, temb, adaln_rows, rope, vsa_plan)

        # 5. Final layer: shift-first AdaLN indexed by timestep index (not modality), then the fp32 heads.
        return self.final_layer(x, temb, timestep_indices, video_indices, audio_indices)

    def embed(
        self, hidden_states, audio_hidden_states, encoder_hidden_states, timestep, timestep_indices, token_tags,
        position_ids, video_indices, audio_indices, text_indices, *, refined_text=None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, RopeTables]:
        """Checks and steps 1-4 of ``forward`` (same arguments): the packed stream before the first block.

        Returns x [B, S, H] stream dtype, temb [M, time_embed_dim] fp32, adaln_rows [S] long, rope (cos, sin) fp32
        [S, 6n]. A sequence-parallel forward (worker/h3/parallel.py) takes its rows from here.
        """
        self._check_inputs(
            hidden_states, audio_hidden_states, encoder_hidden_states, timestep, timestep_indices, token_tags,
            position_ids, video_indices, audio_indices, text_indices, refined_text,
        )
        batch = hidden_states.shape[0]
        rows = position_ids.shape[0]

        # 1. RoPE tables, fp32 [S, 6n].
        rope = self.rope(position_ids)

        # 2. Per-modality projections; the refined text sets the stream dtype.
        if refined_text is None:
            refined_text = self.refine_text(encoder_hidden_states)
        video = self.video_patch_proj(hidden_states.to(self.video_patch_proj.weight.dtype))
        audio = self.audio_patch_proj(audio_hidden_states.to(self.audio_patch_proj.weight.dtype))

        # 3. Packed buffer [B, S, H]: every row written once by exactly one modality.
        x = refined_text.new_zeros((batch, rows, refined_text.shape[-1]))
        x.index_copy_(1, text_indices, refined_text)
        x.index_copy_(1, video_indices, video.to(x.dtype))
        x.index_copy_(1, audio_indices, audio.to(x.dtype))

        # 4. One time embedding per distinct timestep (fp32); AdaLN table row c = 3 * timestep_index + tag per row.
        temb = self.time_embedder(timestep)
        adaln_rows = timestep_indices * MODALITY_COUNT + token_tags  # [S]
        return x, temb, adaln_rows, rope

    def _check_inputs(
        self, video, audio, text, timestep, timestep_indices, token_tags, position_ids, video_indices, audio_indices,
        text_indices, refined_text,
    ) -> None:
        """Shape checks, once per forward; messages quote the shapes seen."""
        cfg = self.config
        if position_ids.ndim != 2 or position_ids.shape[-1] != 3:
            raise ValueError(f"position_ids must be (S, 3), got {list(position_ids.shape)}")
        rows = position_ids.shape[0]
        if token_tags.shape != (rows,) or timestep_indices.shape != (rows,):
            raise ValueError(
                f"token_tags and timestep_indices must both be ({rows},) to match position_ids, got "
                f"{list(token_tags.shape)} and {list(timestep_indices.shape)}"
            )
        if timestep.ndim != 1 or timestep.shape[0] == 0:
            raise ValueError(f"timestep must be a non-empty 1-D tensor of distinct times, got {list(timestep.shape)}")
        if video.ndim != 3 or video.shape[-1] != cfg.video_patch_dim:
            raise ValueError(f"hidden_states must be [B, Nv, {cfg.video_patch_dim}], got {list(video.shape)}")
        batch = video.shape[0]
        if audio.ndim != 3 or audio.shape[0] != batch or audio.shape[-1] != cfg.audio_latents_dim:
            raise ValueError(
                f"audio_hidden_states must be [{batch}, Na, {cfg.audio_latents_dim}], got {list(audio.shape)}"
            )
        if refined_text is not None:
            if refined_text.ndim != 3 or refined_text.shape[0] != batch or refined_text.shape[-1] != cfg.hidden_size:
                raise ValueError(
                    f"refined_text must be [{batch}, L, {cfg.hidden_size}], got {list(refined_text.shape)}"
                )
            text_rows = refined_text.shape[1]
        elif text is None:
            raise ValueError("encoder_hidden_states is required when refined_text is not given")
        else:
            if text.ndim != 3 or text.shape[0] != batch or text.shape[-1] != cfg.text_dim:
                raise ValueError(f"encoder_hidden_states must be [{batch}, L, {cfg.text_dim}], got {list(text.shape)}")
            text_rows = text.shape[1]
        for name, index, count in (
            ("video_indices", video_indices, video.shape[1]),
            ("audio_indices", audio_indices, audio.shape[1]),
            ("text_indices", text_indices, text_rows),
        ):
            if index.shape != (count,):
                raise ValueError(f"{name} must be ({count},) to match its rows, got {list(index.shape)}")
        if video.shape[1] + audio.shape[1] + text_rows != rows:
            raise ValueError(
                f"video {video.shape[1]} + audio {audio.shape[1]} + text {text_rows} rows must equal S = {rows}"
            )


def count_parameters(model: nn.Module) -> int:
    """Number of parameter elements (works on the meta device; buffers excluded)."""
    return sum(p.numel() for p in model.parameters())
