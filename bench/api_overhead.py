"""What the job service adds on top of rendering: end-to-end job latency minus the worker's render time.

For each of N sequential jobs (tiny release, 256x128, 4 s) the client times POST → finished → MP4 downloaded, and
subtracts the worker's own render span (`finished_at - started_at` on the record, claim to completed transition).
The rest is service overhead: API + Redis writes, Celery delivery to the idle worker, noticing completion, download.
Three ways of noticing completion are compared: polling every 50 ms, polling every 5 ms, and one blocking
`GET /jobs/{id}?wait=60` (woken by the job's Redis done channel).

    .venv/bin/python bench/api_overhead.py [--jobs 10] [--json out/bench/api_overhead.json]

Runs the real local stack (worker/serve.py LocalStack: gunicorn API, one worker, Redis) like `make demo`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from h3batch.worker.serve import LocalStack  # noqa: E402

MODES = {"poll 50 ms": 0.050, "poll 5 ms": 0.005, "wait (long-poll)": None}


def _request(method: str, url: str, body: dict | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as reply:
        return reply.status, reply.read()


def one_job(base: str, poll_s: float | None, seed: int) -> dict[str, float]:
    """Seconds for: end to end, render (worker), overhead, queue wait, notice (finish → client knows), download."""
    t0 = time.perf_counter()
    wall0 = time.time()
    _, body = _request("POST", f"{base}/jobs", {"prompt": "rain on a tin roof", "seed": seed})
    job = json.loads(body)
    while job["status"] in ("queued", "in_progress"):
        if poll_s is None:
            _, body = _request("GET", f"{base}/jobs/{job['id']}?wait=60")
        else:
            time.sleep(poll_s)
            _, body = _request("GET", f"{base}/jobs/{job['id']}")
        job = json.loads(body)
    noticed = time.time()
    if job["status"] != "completed":
        raise RuntimeError(f"job {job['id']} ended {job['status']}: {job.get('error')}")
    t_dl = time.perf_counter()
    _, video = _request("GET", f"{base}{job['links']['content']}")
    t1 = time.perf_counter()
    end_to_end = t1 - t0
    render = job["finished_at"] - job["started_at"]
    return {"end_to_end_s": end_to_end, "render_s": render, "overhead_s": end_to_end - render,
            "queue_wait_s": job["started_at"] - wall0, "notice_s": noticed - job["finished_at"],
            "download_s": t1 - t_dl, "bytes": len(video)}


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(round(0.9 * len(ordered))) - 1)]  # nearest rank


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10, help="jobs per mode (default 10)")
    parser.add_argument("--json", default="out/bench/api_overhead.json", help="where to write raw results")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {}
    with LocalStack() as stack:
        one_job(stack.base_url, None, seed=0)  # warm-up: first-request imports, connection pools
        for mode, poll_s in MODES.items():
            results[mode] = [one_job(stack.base_url, poll_s, seed=i) for i in range(args.jobs)]
    header = f"{'mode':<18} {'N':>3} {'e2e med s':>10} {'render med s':>13} {'overhead med ms':>16} " \
             f"{'overhead p90 ms':>16} {'queue ms':>9} {'notice ms':>10} {'download ms':>12}"
    print(header)
    print("-" * len(header))
    for mode, rows in results.items():
        col = {k: [row[k] for row in rows] for k in rows[0]}
        print(f"{mode:<18} {len(rows):>3} {statistics.median(col['end_to_end_s']):>10.3f} "
              f"{statistics.median(col['render_s']):>13.3f} {statistics.median(col['overhead_s']) * 1e3:>16.1f} "
              f"{_p90(col['overhead_s']) * 1e3:>16.1f} {statistics.median(col['queue_wait_s']) * 1e3:>9.1f} "
              f"{statistics.median(col['notice_s']) * 1e3:>10.1f} {statistics.median(col['download_s']) * 1e3:>12.1f}")
    try:
        revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                  check=False).stdout.strip()
    except OSError:
        revision = ""
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"git_revision": revision, "machine": platform.node(), "cpus": os.cpu_count(),
                               "python": platform.python_version(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                           time.gmtime()),
                               "jobs_per_mode": args.jobs, "results": results}, indent=1))
    print(f"raw results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
