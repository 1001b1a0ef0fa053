"""How many concurrent paced sessions one driver process holds with p99 send lateness under 5 ms.

Starts the reference server (`realtime` mode, echo, 64 slots) in its own process, then for each session count runs
the driver in a fresh process (`python -m h3batch.loadrunner.duplex --sessions N`, `--repetitions` times) and reads its
load-result.json. The number that matters: the worst session's p99 send lateness (ms) per N (median over the
repetitions), and the largest N up to which it stays under the 5 ms goal. Also reported: the typical lateness of the
latest session in a frame (median over frames), which shows the driver's own per-session cost without the rare
scheduler spikes of a shared machine.

    .venv/bin/python bench/driver_capacity.py                     # 1..64 sessions, 125 frames (10 s) each
    .venv/bin/python bench/driver_capacity.py --sessions 1 8 64 --load-frames 50

Writes docs/img/driver_capacity.png and docs/img/driver_capacity.json (tagged with git revision, CPU count and load
averages before/after, since the machine may be shared).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
GOAL_MS = 5.0


def write_input(path: Path, seconds: float) -> None:
    t = np.arange(int(seconds * 24_000)) / 24_000
    signal = 0.3 * np.sin(2 * np.pi * 220 * t)
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1), wav.setsampwidth(2), wav.setframerate(24_000)
        wav.writeframes(np.round(signal * 32767).astype("<i2").tobytes())


def start_server(max_sessions: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-P", "-m", "h3batch.loadrunner.server", "--mode", "realtime", "--port", "0",
                             "--max-sessions", str(max_sessions)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    line = proc.stdout.readline()
    if "listening on " not in line:
        proc.kill()
        raise SystemExit(f"reference server did not start: {line!r}")
    return proc, line.split("listening on ")[1].split()[0]


def run_point(url: str, wav: Path, out: Path, sessions: int, frames: int) -> dict:
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-P", "-m", "h3batch.loadrunner.duplex", "--url", url, "--model", "bench",
                             "--input-wav", str(wav), "--output-dir", str(out), "--sessions", str(sessions),
                             "--load-frames", str(frames), "--tail-s", "0", "--drain-s", "1.0",
                             "--timeout-s", "30", "--cleanup-timeout-s", "5"],
                            capture_output=True, text=True, cwd=REPO)
    wall = time.monotonic() - began
    report = json.loads((out / "load-result.json").read_text())
    rows = report["sessions"]
    p99 = [r["client_send_lateness_ms"]["p99"] for r in rows if r["client_send_lateness_ms"]["p99"] is not None]
    med = [r["client_send_lateness_ms"]["median"] for r in rows if r["client_send_lateness_ms"]["median"] is not None]
    rtf = [r["server_stream_rtf"] for r in rows if r["server_stream_rtf"] is not None]
    # Robust to rare scheduler spikes: per frame, the latest session's lateness; then the median over frames.
    frames_sent = min(len(r["input_timeline"]) for r in rows)
    frame_worst = [max(max(0.0, r["input_timeline"][k]["send_started_at_s"] - r["input_timeline"][k]["planned_at_s"])
                       for r in rows) * 1000 for k in range(frames_sent)]
    return {"sessions": sessions, "ok": report["ok"], "exit_status": result.returncode,
            "passed_sessions": report["passed_sessions"], "worst_p99_lateness_ms": max(p99) if p99 else None,
            "median_p99_lateness_ms": float(np.median(p99)) if p99 else None,
            "median_lateness_ms": float(np.median(med)) if med else None,
            "max_lateness_ms": max(r["client_send_lateness_ms"]["max"] or 0 for r in rows),
            "median_frame_worst_lateness_ms": float(np.median(frame_worst)) if frame_worst else None,
            "median_server_stream_rtf": float(np.median(rtf)) if rtf else None, "wall_s": round(wall, 2)}


def plot(points: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    xs = [p["sessions"] for p in points]
    ax.plot(xs, [p["worst_p99_lateness_ms"] for p in points], "o-", label="worst session p99")
    ax.plot(xs, [p["median_p99_lateness_ms"] for p in points], "s--", label="median session p99")
    ax.plot(xs, [p["median_frame_worst_lateness_ms"] for p in points], "^:",
            label="median over frames of the latest session")
    for p in points:
        if not p["ok"]:
            ax.plot([p["sessions"]], [p["worst_p99_lateness_ms"]], "x", color="tab:red", markersize=10)
    ax.axhline(GOAL_MS, color="black", linestyle="--", linewidth=0.8, label="5 ms goal")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent paced sessions (one driver process)")
    ax.set_ylabel("send lateness (ms)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 48, 64])
    parser.add_argument("--load-frames", type=int, default=125)
    parser.add_argument("--repetitions", type=int, default=3, help="runs per session count (median reported)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = parser.parse_args()
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=REPO).stdout.strip() or None
    load_before = os.getloadavg()
    server, url = start_server(max(64, max(args.sessions)))
    points = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wav = Path(tmp) / "input.wav"
            write_input(wav, args.load_frames * 0.08)
            for n in args.sessions:
                runs = [run_point(url, wav, Path(tmp) / f"n{n}-r{r}", n, args.load_frames)
                        for r in range(args.repetitions)]
                point = {key: float(np.median([run[key] for run in runs])) if isinstance(runs[0][key], float)
                         else runs[0][key] for key in runs[0]}
                point["ok"] = all(run["ok"] for run in runs)
                point["worst_p99_lateness_ms_runs"] = [run["worst_p99_lateness_ms"] for run in runs]
                points.append(point)
                print(f"sessions={n:3d} ok={point['ok']!s:5} worst_p99={point['worst_p99_lateness_ms']:.2f} ms "
                      f"(runs {', '.join(f'{v:.2f}' for v in point['worst_p99_lateness_ms_runs'])}) "
                      f"median_p99={point['median_p99_lateness_ms']:.2f} ms "
                      f"typical_frame_worst={point['median_frame_worst_lateness_ms']:.2f} ms "
                      f"server_rtf={point['median_server_stream_rtf']:.3f}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    load_after = os.getloadavg()
    # Capacity: the largest N such that every N' <= N measured kept the median worst-session p99 under the goal.
    capacity = 0
    for p in sorted(points, key=lambda p: p["sessions"]):
        if not (p["ok"] and p["worst_p99_lateness_ms"] < GOAL_MS):
            break
        capacity = p["sessions"]
    meta = {"git_revision": rev, "cpu_count": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "load_avg_before": load_before, "load_avg_after": load_after,
            "load_frames": args.load_frames, "repetitions": args.repetitions, "goal_ms": GOAL_MS, "capacity_sessions_under_goal": capacity}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "driver_capacity.json").write_text(json.dumps({**meta, "points": points}, indent=2))
    plot(points, args.out / "driver_capacity.png",
         f"driver capacity: p99 send lateness vs sessions ({args.load_frames} frames, {os.cpu_count()} CPUs, "
         f"load {load_before[0]:.1f})")
    print(f"capacity: {capacity} sessions with worst p99 send lateness < {GOAL_MS} ms "
          f"(load avg before {load_before[0]:.2f}, after {load_after[0]:.2f}, rev {rev})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
