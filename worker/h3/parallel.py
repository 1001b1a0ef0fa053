"""Ulysses sequence parallelism for the H3 DiT, applied after construction (spec h3-model.md §10, style.md).

`apply_sequence_parallel(model, group)` turns one loaded `H3Transformer` into one rank of an N-rank sequence-parallel
DiT. Every rank holds every weight (replicated: the 33B DiT fits one H200, and SP shards activations, not weights) and
calls `model(...)` with the same full-sequence inputs; each returns the same full outputs. Inside:

    embed (every rank, all S rows) ─▶ keep rows [r·s, r·s + s), s = ⌈S/N⌉, zero-padded to s
    per block, on local rows [B, s, H]: AdaLN + norm1 + qkv/gate projections + QK-norm + RoPE (local rows of the tables)
        all-to-all q, k, v (+ VSA gate g) together: [B, s, heads, hd] ─▶ [B, N·s, heads/N, hd]; drop the N·s − S pad
        attention core on the full sequence for heads/N heads (dense SDPA, or VSA-H3 with the full-sequence plan)
        re-pad to N·s rows, all-to-all back: [B, N·s, heads/N, hd] ─▶ [B, s, heads, hd]; out_proj, gates, FFN local
    final norm + AdaLN + both fp32 heads on local rows ─▶ all-gather [B, s, 96 + 32] ─▶ drop pad ─▶ select video/audio

Padding: when N does not divide S, the last rank(s) carry zero rows (AdaLN row 0, zero RoPE tables). They are cut off
before attention (so no real query ever sees them as keys and they produce no output) and dropped after the gather
(so they are never written back). A zero row stays finite through RMSNorm (0·rsqrt(eps)).

Tile ownership (VSA): nobody owns a tile. The row split only governs per-row work (projections, norms, FFN, AdaLN);
the attention core runs on all S rows in packed order for its heads, so the 64-token tile geometry of the plan (built
once for the full sequence) applies unchanged, however tiles straddle the row blocks. Text and audio prefix rows are
ordinary rows here: the text refiner runs (replicated, dense, once per request) before the split, and the prefix rows
land in whichever row block holds them (rank 0 for any prompt shorter than s rows).

Why not a library: torch.distributed has the collectives but no Ulysses layer; DeepSpeed's and xDiT's are bound to
their own model classes and launchers. The layout math here is a few reshapes around `all_to_all_single`.
Works with gloo (CPU, tests) and NCCL (GPU); one forward at a time per process (the shard of the current forward is
shared with the attention cores through `SequenceParallel.shard`).
"""
from __future__ import annotations

import types
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from h3batch.worker.h3.model import H3Transformer


@dataclass(frozen=True)
class RowShard:
    """Rows of the packed sequence one rank owns: block `rank` of N contiguous blocks of ⌈S/N⌉ rows."""

    rows: int  # S, real rows
    world: int  # N
    rank: int

    @property
    def local_rows(self) -> int:
        """s = ⌈S/N⌉ rows per rank, padding included."""
        return -(-self.rows // self.world)

    @property
    def padded_rows(self) -> int:
        """N·s ≥ S."""
        return self.local_rows * self.world

    @property
    def start(self) -> int:
        return self.rank * self.local_rows

    @property
    def valid_rows(self) -> int:
        """Real rows in this rank's block (the rest are padding; can be 0 when S < N·s − s)."""
        return max(0, min(self.local_rows, self.rows - self.start))

    def take(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's block of `t` along `dim` (length S), zero-padded to s rows."""
        if t.shape[dim] != self.rows:
            raise ValueError(f"row shard: expected {self.rows} rows along dim {dim}, got shape {tuple(t.shape)}")
        block = t.narrow(dim, self.start, self.valid_rows) if self.valid_rows else t.narrow(dim, 0, 0)
        missing = self.local_rows - block.shape[dim]
        if missing == 0:
            return block.contiguous()
        pad_shape = list(t.shape)
        pad_shape[dim] = missing
        return torch.cat((block, t.new_zeros(pad_shape)), dim=dim)


class SequenceParallel:
    """The process group of one SP DiT and the row shard of the forward in flight."""

    def __init__(self, group: dist.ProcessGroup | None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.shard: RowShard | None = None

    def rows_to_heads(self, parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """All-to-all of T tensors [B, s, heads, hd] (local rows, all heads) in one collective.

        Returns [T, B, N·s, heads/N, hd]: every row (padding included, rank-block order) of this rank's heads.
        """
        n = self.world
        b, s, heads, hd = parts[0].shape
        local_heads = heads // n
        send = parts[0].new_empty((n, len(parts), b, s, local_heads, hd))  # [dest rank, T, B, s, h, hd]
        for i, part in enumerate(parts):
            send[:, i] = part.view(b, s, n, local_heads, hd).permute(2, 0, 1, 3, 4)
        recv = torch.empty_like(send)  # [source rank = row block, T, B, s, h, hd]
        dist.all_to_all_single(recv, send, group=self.group)
        return recv.permute(1, 2, 0, 3, 4, 5).reshape(len(parts), b, n * s, local_heads, hd)

    def heads_to_rows(self, out: torch.Tensor, padded_rows: int) -> torch.Tensor:
        """Inverse exchange: [B, S, heads/N, hd] (real rows only) → [B, s, heads, hd]; pad rows come back as zeros."""
        n = self.world
        b, rows, local_heads, hd = out.shape
        s = padded_rows // n
        send = out.new_zeros((n, b, s, local_heads, hd))  # [dest rank = row block, B, s, h, hd]
        for j in range(n):
            lo, hi = j * s, min((j + 1) * s, rows)
            if hi > lo:
                send[j, :, : hi - lo] = out[:, lo:hi]
        recv = torch.empty_like(send)  # [source rank = head group, B, s, h, hd]
        dist.all_to_all_single(recv, send, group=self.group)
        return recv.permute(1, 2, 0, 3, 4).reshape(b, s, n * local_heads, hd)

    def gather_rows(self, local: torch.Tensor, rows: int) -> torch.Tensor:
        """All-gather [B, s, C] row blocks into [B, S, C] (padding dropped); every rank gets the same tensor."""
        blocks = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(blocks, local.contiguous(), group=self.group)
        return torch.cat(blocks, dim=1)[:, :rows]


class UlyssesAttention(nn.Module):
    """Wraps an `AttentionCore`: rows → heads all-to-all, the core on the full sequence, heads → rows all-to-all."""

    def __init__(self, inner: nn.Module, sp: SequenceParallel):
        super().__init__()
        self.inner = inner
        self.sp = sp

    def forward(self, q, k, v, gate, vsa_plan=None) -> torch.Tensor:
        # q, k, v, gate: [B, s, heads, hd] on this rank's rows; gate is None on the dense path.
        shard = self.sp.shard
        assert shard is not None and q.shape[1] == shard.local_rows, "UlyssesAttention called outside the SP forward"
        parts = (q, k, v) if gate is None else (q, k, v, gate)
        full = self.sp.rows_to_heads(parts)[:, :, : shard.rows]  # [T, B, S, heads/N, hd], padding cut off
        out = self.inner(full[0], full[1], full[2], None if gate is None else full[3], vsa_plan)  # [B, S, h/N, hd]
        return self.sp.heads_to_rows(out, shard.padded_rows)  # [B, s, heads, hd]


def apply_sequence_parallel(model: H3Transformer, group: dist.ProcessGroup | None = None) -> H3Transformer:
    """Make `model` one rank of a Ulysses SP DiT over `group` (default: the world), in place; returns it.

    Swaps every DiT block's attention core for `UlyssesAttention` (the refiner stays local: it runs on the text alone)
    and replaces this instance's forward with `sequence_parallel_forward`; weights are untouched (replicated).
    Raises ValueError when the head count does not divide by the group size or the model is already parallel.
    """
    if getattr(model, "sequence_parallel", None) is not None:
        raise ValueError("apply_sequence_parallel: this model is already sequence-parallel")
    sp = SequenceParallel(group)
    parallelize_attention(model.blocks, sp, model.config.num_attention_heads)
    model.sequence_parallel = sp
    model.forward = types.MethodType(sequence_parallel_forward, model)
    return model


def parallelize_attention(blocks, sp: SequenceParallel, heads: int) -> None:
    """Swap each DiT block's attention core for `UlyssesAttention` over `sp` (also used alone by bench/sp_block.py).

    Raises ValueError when `heads` does not divide by the group size.
    """
    if heads % sp.world:
        raise ValueError(
            f"sequence parallelism: expected the {heads} attention heads to divide by the group size, got {sp.world} "
            f"ranks"
        )
    for block in blocks:
        if isinstance(block.attn.core, UlyssesAttention):
            raise ValueError("sequence parallelism: this block's attention is already wrapped")
        block.attn.core = UlyssesAttention(block.attn.core, sp)


def sequence_parallel_forward(
    model: H3Transformer,
    hidden_states: torch.Tensor,  # [B, Nv, P]
    audio_hidden_states: torch.Tensor,  # [B, Na, Ca]
    encoder_hidden_states: torch.Tensor | None,  # [B, L, text_dim]
    timestep: torch.Tensor,  # [M]
    timestep_indices: torch.Tensor,  # [S]
    token_tags: torch.Tensor,  # [S]
    position_ids: torch.Tensor,  # [S, 3]
    video_indices: torch.Tensor,  # [Nv]
    audio_indices: torch.Tensor,  # [Na]
    text_indices: torch.Tensor,  # [L]
    *,
    vsa_plan=None,
    refined_text: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`H3Transformer.forward` on this rank's rows; same arguments and (full) outputs on every rank."""
    sp: SequenceParallel = model.sequence_parallel
    x, temb, adaln_rows, (cos, sin) = model.embed(
        hidden_states, audio_hidden_states, encoder_hidden_states, timestep, timestep_indices, token_tags,
        position_ids, video_indices, audio_indices, text_indices, refined_text=refined_text,
    )
    shard = RowShard(rows=x.shape[1], world=sp.world, rank=sp.rank)
    sp.shard = shard
    try:
        x = shard.take(x, dim=1)  # [B, s, H]
        adaln_rows = shard.take(adaln_rows, dim=0)  # [s]; pad rows read table row 0 (any valid row would do)
        rope = (shard.take(cos, dim=0), shard.take(sin, dim=0))  # [s, 6n] each
        for block in model.blocks:
            x = block(x, temb, adaln_rows, rope, vsa_plan)

        # Final layer on local rows: both fp32 heads on every local row (128 outputs a row: cheaper to compute and
        # gather than the [B, s, H] stream), one all-gather, then the oracle's row selection.
        final = model.final_layer
        y = final.modulate(x, temb, shard.take(timestep_indices, dim=0))  # [B, s, H] fp32
        heads = torch.cat((final.video_out(y), final.audio_out(y)), dim=-1)  # [B, s, P + Ca]
        heads = sp.gather_rows(heads, shard.rows)  # [B, S, P + Ca]
    finally:
        sp.shard = None
    video_width = final.video_out.out_features
    video = heads[..., :video_width].index_select(1, video_indices)  # [B, Nv, P]
    audio = heads[..., video_width:].index_select(1, audio_indices)  # [B, Na, Ca]
    return video, audio

