"""One real-size DiT block through the Ulysses SP code path at N = 1 vs the plain block, on one GPU.

Shows what the sequence-parallel wrapping costs when there is nothing to split: the row shard, the packing of q, k, v
into the all-to-all buffer, a 1-rank NCCL all_to_all_single each way, and the unpacking. Geometry is the V2 recipe
1344×768, 4.4 s with a 128-token prompt: S = 128 + 356 + 32,256 = 32,740 rows; hidden 5376, 56×128 heads, SwiGLU
14336, random bf16 weights, dense SDPA attention (the exchange is the same for VSA, which only changes the core).
Times are CUDA-event medians after warm-up.

Usage (GPU machine): python bench/sp_block.py --out $OUT   → prints a table, writes OUT/sp_block.json
Smoke test of the script on CPU (gloo, tiny config T2, 256×128): python bench/sp_block.py --smoke
"""
from __future__ import annotations

import argparse
import json
import platform
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from timing import times_ms as time_ms

from h3batch.core.geometry import RequestGeometry  # noqa: E402
from h3batch.worker.h3.config import T2, H3Config  # noqa: E402
from h3batch.worker.h3.model import DiTBlock, RotaryEmbedding  # noqa: E402
from h3batch.worker.h3.packing import build_packed_layout  # noqa: E402
from h3batch.worker.h3.parallel import RowShard, SequenceParallel, parallelize_attention  # noqa: E402

TEXT_ROWS = 128
WIDTH, HEIGHT, SECONDS = 1344, 768, 4.4


def random_block(config: H3Config, device: torch.device) -> DiTBlock:
    """A DiTBlock with N(0, 1/fan_in) weights (AdaLN scaled down so the modulation stays O(1))."""
    with device:
        block = DiTBlock(config, torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, param in block.named_parameters():
            if param.ndim == 1:
                param.fill_(1.0 if "norm" in name else 0.0)
            else:
                scale = (0.2 if "adaln" in name else 1.0) / param.shape[1] ** 0.5
                param.copy_(torch.randn(param.shape, generator=gen, device=device) * scale)
    return block.eval().requires_grad_(False)


def revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[1]).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for sp_block.json")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny config T2 at 256×128 (checks the script)")
    args = parser.parse_args(argv)
    if args.smoke:
        device, backend, config, geometry = torch.device("cpu"), "gloo", T2, RequestGeometry(256, 128, 4.0)
    else:
        device, backend, config = torch.device("cuda", 0), "nccl", H3Config()
        geometry = RequestGeometry(WIDTH, HEIGHT, SECONDS)
        torch.cuda.set_device(device)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)

    layout = build_packed_layout(TEXT_ROWS, geometry).to(device)
    rows = layout.sequence_length
    block = random_block(config, device)
    rope = RotaryEmbedding(config).to(device)(layout.position_ids)  # fp32 [S, 96] each
    temb = torch.randn(2, config.time_embed_dim, device=device)  # M = 2 (t_v, t_a)
    timestep_indices = torch.zeros(rows, dtype=torch.long, device=device)
    timestep_indices[layout.audio_indices] = 1
    adaln_rows = timestep_indices * 3 + layout.token_tags
    x = torch.randn(1, rows, config.hidden_size, device=device, dtype=torch.bfloat16)

    results: dict = {"config": {"S": rows, "hidden": config.hidden_size, "heads": config.num_attention_heads,
                                "head_dim": config.attention_head_dim, "ffn": config.ffn_hidden_size,
                                "attention": "dense SDPA", "dtype": "bf16"},
                     "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (smoke)",
                     "torch": torch.__version__,
                     "python": platform.python_version(), "git": revision()}

    cuda = device.type == "cuda"
    with torch.inference_mode():
        def plain():
            return block(x, temb, adaln_rows, rope)

        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        plain_ms = time_ms(plain, args.reps, args.warmup)
        plain_peak = torch.cuda.max_memory_allocated(device) if cuda else 0
        reference = plain()

        sp = SequenceParallel(None)
        parallelize_attention([block], sp, config.num_attention_heads)
        shard = RowShard(rows, sp.world, sp.rank)

        def sequence_parallel():
            sp.shard = shard
            local = block(shard.take(x, 1), temb, shard.take(adaln_rows, 0),
                          (shard.take(rope[0], 0), shard.take(rope[1], 0)))
            sp.shard = None
            return local

        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        sp_ms = time_ms(sequence_parallel, args.reps, args.warmup)
        sp_peak = torch.cuda.max_memory_allocated(device) if cuda else 0
        diff = (sequence_parallel().float() - reference.float()).abs().max().item()

        # The exchange alone: q, k, v in (one collective), the attention output back.
        q = torch.randn(1, rows, config.num_attention_heads, config.attention_head_dim, device=device,
                        dtype=torch.bfloat16)
        exchange_ms = time_ms(lambda: sp.heads_to_rows(sp.rows_to_heads((q, q, q))[0], shard.padded_rows),
                              args.reps, args.warmup)

    med = statistics.median
    results.update({
        "plain_block_ms": med(plain_ms), "sp_n1_block_ms": med(sp_ms), "sp_n1_exchange_ms": med(exchange_ms),
        "overhead_pct": 100.0 * (med(sp_ms) - med(plain_ms)) / med(plain_ms),
        "max_abs_diff": diff, "plain_peak_gib": plain_peak / 2**30, "sp_n1_peak_gib": sp_peak / 2**30,
        "samples_ms": {"plain": plain_ms, "sp_n1": sp_ms, "exchange": exchange_ms},
    })
    print(f"DiT block, S={rows}, {config.num_attention_heads}x{config.attention_head_dim} heads, bf16, "
          f"{results['gpu']}")
    print(f"{'path':<28}{'median ms':>12}{'min ms':>10}{'peak GiB':>10}")
    print(f"{'plain DiTBlock':<28}{med(plain_ms):>12.2f}{min(plain_ms):>10.2f}{plain_peak / 2**30:>10.2f}")
    print(f"{'SP path, N=1 (' + backend + ')':<28}{med(sp_ms):>12.2f}{min(sp_ms):>10.2f}{sp_peak / 2**30:>10.2f}")
    print(f"{'  exchange alone (q,k,v+out)':<28}{med(exchange_ms):>12.2f}{min(exchange_ms):>10.2f}")
    print(f"overhead {results['overhead_pct']:+.2f} %, max |SP − plain| = {diff:.3g}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sp_block.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
