"""bench/e2e.py runs end to end on the CPU at tiny shapes: ours and the baseline through the real Pipeline."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from h3batch.worker.h3.mp4 import LEGACY_VIDEO_PRESET, VIDEO_PRESET

BENCH = Path(__file__).resolve().parents[4] / "bench" / "e2e.py"


def test_tiny_e2e_bench_reports_every_stage_for_both_paths(tmp_path):
    """Two jobs of ours and one baseline job give stage seconds, whole-job time, the GPU idle between ours' jobs
    and a stage table whose first column is the stage; both paths write a 107-frame MP4."""
    out = tmp_path / "e2e.json"
    proc = subprocess.run(
        [sys.executable, "-P", str(BENCH), "--tiny", "--baseline", "--baseline-jobs", "1", "--jobs", "2", "--size", "64x64",
         "--text-tokens", "8", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    stages = ("text_encode", "denoise", "decode", "mux", "whole job")
    for path in ("ours", "baseline"):
        assert all(res[path]["steady"][stage] > 0 for stage in stages)
        assert all(job["frames"] == 107 and job["mp4_bytes"] > 0 for job in res[path]["jobs"])
    assert len(res["ours"]["jobs"]) == 2 and res["ours"]["gpu_idle_between_jobs_s"][0] >= 0
    assert res["ours"]["warm_up_s"] > 0 and "first_job_vs_later" in res["ours"]
    rows = [line.split("|")[1].strip() for line in res["table"].splitlines()[2:]]
    assert rows == [f"`{stage}`" for stage in stages]
    assert VIDEO_PRESET != LEGACY_VIDEO_PRESET  # the two paths differ in the encoder setting too
