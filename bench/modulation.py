"""Benchmark the four fused modulation ops at the 4.4 s recipe's size: 32,740 rows x 5376, bf16, K = 6 table rows.

One run measures, on one CUDA device: the device copy bandwidth (torch copy_), and per op the eager torch reference,
torch.compile of that reference, and the Triton kernel, in the precision the automatic dispatch picks (sm90 on
Hopper; the RMS ops also in generic). Times are CUDA-event medians of many reps of 10 back-to-back calls, after
warm-up; first-call (compile) time is reported apart. Achieved GB/s counts the bytes an op must move (activations
read and written, tables, weight, indices) over its time.

    python bench/modulation.py [--rows 32740] [--hidden 5376] [--reps 30] [--sweep 1024:4,8192:8]

Prints a table; writes `modulation.json` under $OUT when OUT is set. `--sweep BLOCK:WARPS,...` also times the Triton
kernels at other chunk sizes and warp counts (by patching each launcher's block_config; the table shows the default).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import triton
from timing import median_ms

from h3batch import kernels
from h3batch.kernels import gate, gate_rms_norm_scale_shift, rms_norm_scale_shift, scale_shift
from h3batch.kernels.backend import resolve_precision
from h3batch.kernels.launch import block_config


def time_ms(fn: Callable[[], object], reps: int) -> float:
    """Median per-call ms over 10 back-to-back calls (the host runs ahead of the GPU as inside the DiT)."""
    return median_ms(fn, reps, warmup=3, inner=10)


EPS = 1e-6


@dataclass
class Row:
    op: str
    impl: str
    ms: float
    gbps: float
    copy_fraction: float
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    compile_s: float | None = None


def build_inputs(rows: int, hidden: int, table_rows: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(torch.bfloat16)

    ada = randn(table_rows, 6 * hidden)  # adaLN projection rows; tables are row views with row stride 6H
    return {
        "x": randn(rows, hidden), "branch": randn(rows, hidden),
        "shift": ada[:, 0:hidden], "scale": ada[:, hidden:2 * hidden] * 0.01, "gate": ada[:, 2 * hidden:3 * hidden],
        "weight": 1 + 0.1 * randn(hidden),
        "indices": torch.randint(0, table_rows, (rows,), generator=g, device="cuda"),
    }


def op_table(t: dict, mode) -> dict[str, dict]:
    """Per op: eager reference, compilable reference, Triton call, bytes it must move."""
    rows, hidden = t["x"].shape
    act = rows * hidden * 2  # one bf16 activation tensor
    table = t["shift"].shape[0] * hidden * 2
    small = rows * t["indices"].element_size() + hidden * t["weight"].element_size()
    x_scratch = t["x"].clone()  # the in-place op works on its own copy

    def gate_norm_ref(residual, gate_, branch, weight, shift, scale, indices):
        return gate_rms_norm_scale_shift.reference_indexed_gate_rms_norm_scale_shift(
            residual, gate_, branch, weight, shift, scale, indices, EPS, mode)

    def rms_ref(x, weight, shift, scale, indices):
        return rms_norm_scale_shift.reference_rms_norm_indexed_scale_shift(x, weight, shift, scale, indices, EPS,
                                                                           mode)

    def scale_shift_ref(x, shift, scale, indices):
        return x.copy_(scale_shift.reference_indexed_scale_shift(x, shift, scale, indices))

    def gate_ref(x, gate_, other, indices):
        return gate.reference_indexed_gate(x, gate_, other, indices)

    return {
        "indexed_gate_rms_norm_scale_shift": {
            "ref": gate_norm_ref, "args": (t["x"], t["gate"], t["branch"], t["weight"], t["shift"], t["scale"],
                                           t["indices"]),
            "triton": lambda: kernels.indexed_gate_rms_norm_scale_shift(
                t["x"], t["gate"], t["branch"], t["weight"], t["shift"], t["scale"], t["indices"], EPS,
                precision=mode, backend="triton"),
            "triton_generic": lambda: kernels.indexed_gate_rms_norm_scale_shift(
                t["x"], t["gate"], t["branch"], t["weight"], t["shift"], t["scale"], t["indices"], EPS,
                precision="generic", backend="triton"),
            "bytes": 4 * act + 3 * table + small, "module": gate_rms_norm_scale_shift},
        "rms_norm_indexed_scale_shift": {
            "ref": rms_ref, "args": (t["x"], t["weight"], t["shift"], t["scale"], t["indices"]),
            "triton": lambda: kernels.rms_norm_indexed_scale_shift(
                t["x"], t["weight"], t["shift"], t["scale"], t["indices"], EPS, precision=mode, backend="triton"),
            "triton_generic": lambda: kernels.rms_norm_indexed_scale_shift(
                t["x"], t["weight"], t["shift"], t["scale"], t["indices"], EPS, precision="generic",
                backend="triton"),
            "bytes": 2 * act + 2 * table + small, "module": rms_norm_scale_shift},
        "indexed_scale_shift_": {
            "ref": scale_shift_ref, "args": (x_scratch, t["shift"], t["scale"], t["indices"]),
            "triton": lambda: kernels.indexed_scale_shift_(x_scratch, t["shift"], t["scale"], t["indices"],
                                                           backend="triton"),
            "bytes": 2 * act + 2 * table + small, "module": scale_shift},
        "indexed_gate": {
            "ref": gate_ref, "args": (t["x"], t["gate"], t["branch"], t["indices"]),
            "triton": lambda: kernels.indexed_gate(t["x"], t["gate"], t["branch"], t["indices"], backend="triton"),
            "bytes": 3 * act + table + small, "module": gate},
    }


def check_agreement(name: str, spec: dict) -> dict:
    """Triton vs eager reference at full size: elements that differ and the largest difference."""
    if name == "indexed_scale_shift_":
        return {}  # in place on a scratch buffer that every timed call rewrites; covered by the tests
    ref = spec["ref"](*spec["args"])
    out = spec["triton"]()
    pairs = zip(ref, out) if isinstance(ref, tuple) else [(ref, out)]
    report = {}
    for k, (a, b) in enumerate(pairs):
        report[f"output{k}_differing_fraction"] = (a != b).float().mean().item()
        report[f"output{k}_max_abs_diff"] = (a.float() - b.float()).abs().max().item()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32740)
    parser.add_argument("--hidden", type=int, default=5376)
    parser.add_argument("--table-rows", type=int, default=6)
    parser.add_argument("--reps", type=int, default=30, help="timed reps of 10 back-to-back calls each")
    parser.add_argument("--sweep", default="", help="comma-separated BLOCK:WARPS launch configs to time as well")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile baselines")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench/modulation.py needs a CUDA device", file=sys.stderr)
        return 2

    t = build_inputs(args.rows, args.hidden, args.table_rows)
    mode = resolve_precision(None, t["x"])
    src = torch.empty(args.rows * args.hidden * 4, dtype=torch.bfloat16, device="cuda")  # 4 activations' worth
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src), args.reps)
    copy_gbps = 2 * src.numel() * 2 / copy_ms / 1e6
    del src, dst

    rows: list[Row] = []
    sweep: list[dict] = []
    agreement: dict[str, dict] = {}
    for name, spec in op_table(t, mode).items():
        eager_ms = time_ms(lambda: spec["ref"](*spec["args"]), args.reps)
        compile_ms = compile_s = None
        if not args.no_compile:
            compiled = torch.compile(spec["ref"], dynamic=False)
            began = time.perf_counter()
            compiled(*spec["args"])
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - began
            compile_ms = time_ms(lambda: compiled(*spec["args"]), args.reps)
        began = time.perf_counter()
        spec["triton"]()
        torch.cuda.synchronize()
        triton_first_s = time.perf_counter() - began
        triton_ms = time_ms(spec["triton"], args.reps)
        agreement[name] = check_agreement(name, spec)

        def row(impl, ms, first_s):
            gbps = spec["bytes"] / ms / 1e6
            return Row(name, impl, ms, gbps, gbps / copy_gbps, eager_ms / ms,
                       compile_ms / ms if compile_ms else None, first_s)

        rows.append(row("eager", eager_ms, None))
        if compile_ms is not None:
            rows.append(row("compile", compile_ms, compile_s))
        rows.append(row("triton", triton_ms, triton_first_s))
        if "triton_generic" in spec and mode.value != "generic":
            rows.append(row("triton/generic", time_ms(spec["triton_generic"], args.reps), None))

        module = spec["module"]
        for config in [c for c in args.sweep.split(",") if c]:
            block, warps = (int(v) for v in config.split(":"))
            original = module.block_config
            module.block_config = lambda hidden, b=block, w=warps: (b, w)
            try:
                ms = time_ms(spec["triton"], args.reps)
            finally:
                module.block_config = original
            sweep.append({"op": name, "block": block, "num_warps": warps, "ms": ms,
                          "gbps": spec["bytes"] / ms / 1e6})

    device_name = torch.cuda.get_device_name()
    capability = ".".join(map(str, torch.cuda.get_device_capability()))
    header = (f"{device_name} (cc {capability}), torch {torch.__version__}, triton {triton.__version__}; "
              f"{args.rows} x {args.hidden} bf16, K={args.table_rows}, precision {mode.value}, "
              f"default block/warps {block_config(args.hidden)}, median of {args.reps} x 10 calls")
    print(header)
    print(f"device copy bandwidth (torch copy_, read+write): {copy_gbps:.0f} GB/s ({copy_ms:.3f} ms)")
    print(f"{'op':36s} {'impl':14s} {'ms':>8s} {'GB/s':>7s} {'of copy':>8s} {'vs eager':>9s} {'vs compile':>10s}"
          f" {'first call s':>12s}")
    for r in rows:
        vs_compile = f"{r.speedup_vs_compile:9.2f}x" if r.speedup_vs_compile else f"{'-':>10s}"
        first = f"{r.compile_s:12.2f}" if r.compile_s is not None else f"{'-':>12s}"
        print(f"{r.op:36s} {r.impl:14s} {r.ms:8.3f} {r.gbps:7.0f} {r.copy_fraction:8.1%} {r.speedup_vs_eager:8.2f}x "
              f"{vs_compile} {first}")
    for s in sweep:
        print(f"sweep {s['op']:36s} block={s['block']:5d} warps={s['num_warps']:2d} {s['ms']:8.3f} ms "
              f"{s['gbps']:7.0f} GB/s "
              f"({s['gbps'] / copy_gbps:.1%} of copy)")
    print("triton vs eager at full size:", json.dumps(agreement))

    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "modulation.json"
        out.write_text(json.dumps({
            "header": header, "device": device_name, "torch": torch.__version__, "triton": triton.__version__,
            "git_rev": os.environ.get("H3BATCH_GIT_REV", "unknown"), "host": platform.node(),
            "rows": args.rows, "hidden": args.hidden, "table_rows": args.table_rows, "reps": args.reps,
            "precision": mode.value, "copy_gbps": copy_gbps, "copy_ms": copy_ms,
            "results": [asdict(r) for r in rows], "launch_sweep": sweep, "agreement": agreement,
        }, indent=2))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
