"""Run by test_vsa_cuda.py in a subprocess with TRITON_INTERPRET=1: the two Triton kernels on CPU tensors.

Prints one JSON line: whether the tile kernel's buffer equals the torch one (also head-major, as the compiled VSA
kernel takes it), its mean error, and whether the combine kernel equals the eager bf16 expression bit for bit.
(TRITON_INTERPRET must be set before triton is imported, hence a separate process.)
"""
import json

import torch

from h3batch.worker.h3 import vsa_cuda
from h3batch.worker.h3.vsa_plan import build_vsa_plan

plan = build_vsa_plan((12, 74), (8, 8, 10), 0.8)
geo = vsa_cuda.tiled_geometry(plan, torch.device("cpu"))
gen = torch.Generator().manual_seed(0)
qkv = torch.randn(2, plan.sequence_length, 3, 2, 32, generator=gen).to(torch.bfloat16)
v = qkv[:, :, 2]  # strided view, as the DiT passes v
tiled, means = vsa_cuda.launch_tile_and_mean(v, geo)
torch_tiled = vsa_cuda.to_tiles(v, geo)
tiled_bhsd, means_bhsd = vsa_cuda.launch_tile_and_mean(v, geo, head_major=True)
fine = torch.randn(2, geo.num_slots, 2, 32, generator=gen).to(torch.bfloat16)
gate = torch.randn(2, plan.sequence_length, 2, 32, generator=gen).to(torch.bfloat16)
coarse = torch.randn(2, 2, plan.num_tiles, 32, generator=gen).to(torch.bfloat16)
expected = fine.index_select(1, geo.untile) + gate * coarse.transpose(1, 2).index_select(1, geo.row_tile)
print(json.dumps({
    "tiled_equal": torch.equal(tiled, torch_tiled),
    "tiled_head_major_equal": torch.equal(tiled_bhsd, torch_tiled.transpose(1, 2)) and torch.equal(means_bhsd, means),
    "means_err": (means - vsa_cuda.tile_means(torch_tiled, geo)).abs().max().item(),
    "combine_equal": torch.equal(vsa_cuda.launch_combine(fine, gate, coarse, geo), expected),
}))
