"""Soak (`make test-soak`, not in `make test`): SOAK_JOBS single jobs (default 300) and SOAK_BATCHES batches of
SOAK_BATCH_ITEMS items (default SOAK_JOBS / 25 batches of 5) through `h3batch serve` (its own Redis with AOF, one
worker, the API, all supervised) while a fault thread kills the worker (-9), the API (-9) and restarts Redis
(SHUTDOWN, as `docker compose restart redis`); then every record's artifacts expire (H3BATCH_RESULT_TTL_S).

The batches are submitted while the faults run, interleaved with the single jobs, each with a fate: kept, cancelled,
deleted, or cancelled and deleted at the same moment (two racing requests), a few seconds after it was accepted. A
kept or cancelled batch's archive is fetched as soon as the batch has finished: its members must be exactly its
manifest's completed items plus the manifest. A deleted batch must answer 404 and leave no record of itself or of its
jobs (no stub).

Reports, as one JSON line and asserted: jobs and batch items lost, completed twice, stuck (batches unfinished too),
answers 5xx other than the designed 503s, archive members missing or named twice, disk left under the artifacts dir
after expiry (all 0), and the RSS of API and worker (peak, and growth over the quiet last phase, which must stay
flat). Redis is restarted cleanly, not kill -9'd: with `appendfsync everysec` a kill -9 may lose the last second of
acknowledged creates (docs/reliability.md, Known limits).
"""
from __future__ import annotations

import io
import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
import zipfile
from pathlib import Path

import pytest
import redis
import requests

from tests.system.conftest import H3BATCH, service_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600),
              pytest.mark.skipif(os.environ.get("H3BATCH_SOAK") != "1",
                                 reason="soak run (minutes on 2 cores): `make test-soak`")]

JOBS = int(os.environ.get("SOAK_JOBS", "300"))
FAULT_EVERY_S = float(os.environ.get("SOAK_FAULT_EVERY_S", "15"))
WAIT_S = float(os.environ.get("SOAK_WAIT_S", "600"))
"""How long the run may take to finish every job and batch after the last one was sent."""
"""Mean seconds between faults (jittered 0.5-1.5x); never the same kind twice in a row."""
QUIET_SHARE = 0.25
"""The last quarter of the jobs runs without faults: the RSS flatness window."""
BATCHES = int(os.environ.get("SOAK_BATCHES", str(max(1, JOBS // 25))))
BATCH_ITEMS = int(os.environ.get("SOAK_BATCH_ITEMS", "5"))
RESULT_TTL_S = os.environ.get("SOAK_RESULT_TTL_S", "30")
"""Artifacts expire this long after completion (then the disk must be empty); long enough that a finished batch's
archive, fetched at once, still holds most of its clips."""
FATES = ("keep", "cancel", "delete", "cancel+delete", "keep")
"""A batch's fate, in turn: left alone, cancelled, deleted, or cancelled and deleted by two racing requests."""
FINISHED_STATUSES = ("completed", "failed", "cancelled", "expired")


def _rss_mb(pgid: int) -> float:
    """Resident memory of every process in a process group (gunicorn master + workers; the Celery worker)."""
    total_kb = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            status = (entry / "status").read_text()
        except (OSError, ProcessLookupError):
            continue
        match = re.search(r"VmRSS:\s+(\d+) kB", status)
        total_kb += int(match.group(1)) if match else 0
    return total_kb / 1024


class Soak:
    def __init__(self, root: Path, tiny_release: Path):
        self.root = root
        self.port = int(os.environ.get("SOAK_PORT", "0")) or _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = service_env("unused", root / "var" / "artifacts", H3BATCH_RELEASE=str(tiny_release),
                          H3BATCH_HF_CACHE=str(tiny_release.parent / "hf-cache"), H3BATCH_DEVICE="cpu",
                          H3BATCH_LEASE_TTL_S="3", H3BATCH_RECONCILE_INTERVAL_S="0.5",
                          H3BATCH_RESULT_TTL_S=RESULT_TTL_S,
                          H3BATCH_LOG_LEVEL="WARNING")
        del env["H3BATCH_REDIS_URL"]
        self.out = (root / "serve.out").open("w")
        self.proc = subprocess.Popen(H3BATCH + ["serve", "--port", str(self.port)], cwd=root, env=env,
                                     stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True)
        self.accepted: list[str] = []
        self.errors_5xx: list[str] = []
        self.answers_503 = 0
        self.faults = {"worker_kill9": 0, "api_kill9": 0, "redis_restart": 0}
        self.batches: dict[str, dict] = {}  # batch id -> {"fate", "jobs", "answers", "archive"}
        self.batch_threads: list[threading.Thread] = []
        self.last_fault = ""
        self.rss = {"api": [], "worker": []}
        self.stop = threading.Event()
        self.faulting = threading.Event()
        self.faulting.set()

    def output(self) -> str:
        return (self.root / "serve.out").read_text()

    def pid(self, name: str) -> int:
        return int(re.findall(rf"{name} started pid=(\d+)", self.output())[-1])

    def redis(self) -> redis.Redis:
        port = int(re.search(r"private redis-server on 127\.0\.0\.1:(\d+)", self.output()).group(1))
        return redis.Redis(port=port, decode_responses=True, socket_timeout=5)

    def request(self, method: str, path: str, **kw) -> requests.Response | None:
        try:
            reply = requests.request(method, self.base + path, timeout=10, **kw)
        except requests.RequestException:
            return None  # API restarting: the client retries, as a real one would
        if reply.status_code == 503:
            self.answers_503 += 1  # designed: storage_unavailable / not_ready while Redis restarts
        elif reply.status_code >= 500:
            self.errors_5xx.append(f"{method} {path} {reply.status_code} {reply.text[:200]}")
        return reply

    def submit(self) -> None:
        for i in range(JOBS):
            if i >= JOBS * (1 - QUIET_SHARE) and self.faulting.is_set():
                # The faults end once the fault phase's jobs have finished, not merely been sent: at a small
                # SOAK_JOBS every job is sent in the first seconds, before any fault could fire.
                while not self.stop.is_set() and self._finished() < i:
                    time.sleep(0.5)
                self.faulting.clear()
            key = uuid.uuid4().hex
            while not self.stop.is_set():  # the same Idempotency-Key on every retry: never two jobs for one create
                assert self.proc.poll() is None, self.output()[-3000:]
                reply = self.request("POST", "/jobs", json={"prompt": f"soak {i}", "width": 128, "height": 32,
                                                            "seed": i}, headers={"Idempotency-Key": key})
                if reply is not None and reply.status_code in (200, 202):
                    self.accepted.append(reply.json()["id"])
                    break
                time.sleep(0.5)
            while not self.stop.is_set() and self._queued() > 8:  # keep a short queue: the run measures faults
                time.sleep(0.2)

    def submit_batches(self) -> None:
        """BATCHES batches spread over the faulting phase (paced by the single jobs accepted), each given its fate."""
        rng = random.Random(29)
        for b in range(BATCHES):
            while not self.stop.is_set() and len(self.accepted) < JOBS * (1 - QUIET_SHARE) * b / BATCHES:
                time.sleep(0.2)
            body = {"requests": [{"prompt": f"soak batch {b} item {k}", "width": 128, "height": 32, "seed": k,
                                  "custom_id": f"b{b}-{k}"} for k in range(BATCH_ITEMS)]}
            key, batch_id = uuid.uuid4().hex, None
            while batch_id is None and not self.stop.is_set():
                reply = self.request("POST", "/batches", json=body, headers={"Idempotency-Key": key})
                if reply is not None and reply.status_code in (200, 202):
                    batch_id = reply.json()["id"]
                else:
                    time.sleep(0.5)
            jobs = None
            while jobs is None and not self.stop.is_set():  # the job ids, before any fate can delete them
                reply = self.request("GET", f"/batches/{batch_id}/results")
                if reply is not None and reply.status_code == 200:
                    jobs = [json.loads(line)["job_id"] for line in reply.text.splitlines() if line.strip()]
                else:
                    time.sleep(0.5)
            fate = FATES[b % len(FATES)]
            self.batches[batch_id] = {"fate": fate, "jobs": jobs or [], "answers": [], "archive": None}
            actions = {"keep": [], "cancel": ["cancel"], "delete": ["delete"],
                       "cancel+delete": ["cancel", "delete"]}[fate]
            if actions:
                gate = threading.Barrier(len(actions))
                delay = rng.uniform(0.0, 4.0)  # queued, mid-run or finished: whatever the moment is
                for action in actions:
                    thread = threading.Thread(target=self._act, args=(batch_id, action, delay, gate), daemon=True)
                    thread.start()
                    self.batch_threads.append(thread)

    def _act(self, batch_id: str, action: str, delay: float, gate: threading.Barrier) -> None:
        """One cancel or delete, retried through API restarts and Redis outages until it gets a final answer."""
        time.sleep(delay)
        gate.wait()
        method, path = ("POST", f"/batches/{batch_id}/cancel") if action == "cancel" else \
            ("DELETE", f"/batches/{batch_id}")
        while not self.stop.is_set():
            reply = self.request(method, path)
            if reply is not None and reply.status_code != 503:
                self.batches[batch_id]["answers"].append((action, reply.status_code))
                return
            time.sleep(0.5)

    def fetch_archives(self) -> None:
        """Each kept or cancelled batch's archive once it has finished: members against its own manifest."""
        while not self.stop.wait(1.0):
            for batch_id, info in list(self.batches.items()):
                if info["archive"] is not None or "delete" in info["fate"]:
                    continue
                reply = self.request("GET", f"/batches/{batch_id}")
                if reply is None or reply.status_code != 200 or reply.json().get("finished_at") is None:
                    continue
                archive = self.request("GET", f"/batches/{batch_id}/archive")
                if archive is None or archive.status_code != 200:
                    continue
                with zipfile.ZipFile(io.BytesIO(archive.content)) as zf:
                    names = [i.filename for i in zf.infolist()]
                    manifest = [json.loads(line) for line in zf.read("manifest.jsonl").decode().splitlines()]
                completed = [line for line in manifest if line.get("status") == "completed"]
                info["archive"] = {"members": len(names), "unique": len(set(names)), "completed": len(completed),
                                   "expired": sum(1 for line in manifest if line.get("status") == "expired"),
                                   "statuses": {line["job_id"]: line["status"] for line in manifest}}

    def _finished(self) -> int:
        """Accepted single jobs that have finished (0 while Redis is away)."""
        try:
            with self.redis().pipeline(transaction=False) as pipe:
                for job_id in self.accepted:
                    pipe.hget(f"h3b:job:{job_id}", "status")
                return sum(1 for status in pipe.execute() if status in FINISHED_STATUSES)
        except (redis.RedisError, AttributeError):
            return 0

    def _queued(self) -> int:
        try:
            return int(self.redis().zcard("h3b:queue"))
        except (redis.RedisError, AttributeError):
            return 0

    def poll(self) -> None:
        while not self.stop.wait(0.5):
            if self.accepted:
                self.request("GET", f"/jobs/{random.choice(self.accepted)}")
            self.request("GET", "/healthz")
            for name in ("api", "worker"):
                try:
                    mb = _rss_mb(self.pid(name))
                    if mb > 0:  # 0: between a kill and the restart
                        self.rss[name].append((len(self.accepted), mb))
                except (IndexError, ValueError):
                    pass

    def fault(self) -> None:
        rng = random.Random(17)
        kinds = list(self.faults)
        while not self.stop.wait(FAULT_EVERY_S * rng.uniform(0.5, 1.5)):
            if not self.faulting.is_set():
                continue
            rng.shuffle(kinds)  # each kind once per round, in random order: never a burst of one kind
            kind = kinds[0] if kinds[0] != self.last_fault else kinds[1]
            self.last_fault = kind
            try:
                if kind == "worker_kill9":
                    os.killpg(self.pid("worker"), signal.SIGKILL)
                elif kind == "api_kill9":
                    os.killpg(self.pid("api"), signal.SIGKILL)
                else:
                    # A raw SHUTDOWN: redis-py retries a command whose connection closed, which would shut down the
                    # Redis that serve has just restarted, again and again.
                    port = self.redis().connection_pool.connection_kwargs["port"]
                    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                        conn.sendall(b"SHUTDOWN\r\n")
                        conn.recv(64)  # the server closes the connection as it exits
            except (OSError, redis.RedisError):  # ProcessLookupError is an OSError
                continue
            self.faults[kind] += 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_soak_jobs_through_the_local_stack_under_kills_and_restarts(tiny_release, tmp_path):
    """SOAK_JOBS jobs and SOAK_BATCHES batches (kept, cancelled, deleted, cancel racing delete) with random worker
    kill -9, API kill -9 and Redis restarts: none lost, none completed twice, none stuck, no unexpected 5xx, every
    archive holds exactly its manifest's completed items, deleted batches leave nothing, nothing left on disk once
    every artifact expired, RSS flat in the quiet phase."""
    soak = Soak(tmp_path, tiny_release)
    started = time.monotonic()
    try:
        deadline = time.monotonic() + 300
        while "ready: http" not in soak.output():
            assert soak.proc.poll() is None and time.monotonic() < deadline, soak.output()[-3000:]
            time.sleep(0.2)
        threads = [threading.Thread(target=t, daemon=True) for t in (soak.poll, soak.fault, soak.fetch_archives)]
        for thread in threads:
            thread.start()
        batcher = threading.Thread(target=soak.submit_batches, daemon=True)
        batcher.start()
        soak.submit()
        batcher.join()
        for thread in soak.batch_threads:
            thread.join(timeout=120)
        soak.faulting.clear()
        finished: dict[str, str | None] = {}
        items: dict[str, str | None] = {}
        kept = [b for b, info in soak.batches.items() if "delete" not in info["fate"]]
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                r = soak.redis()
                with r.pipeline(transaction=False) as pipe:
                    for job_id in soak.accepted:
                        pipe.hget(f"h3b:job:{job_id}", "status")
                    finished = dict(zip(soak.accepted, pipe.execute()))
                item_ids = [j for b in kept for j in soak.batches[b]["jobs"]]
                with r.pipeline(transaction=False) as pipe:
                    for job_id in item_ids:
                        pipe.hget(f"h3b:job:{job_id}", "status")
                    items = dict(zip(item_ids, pipe.execute()))
                # A finished item's record may have expired (a cancelled one's after H3BATCH_RESULT_TTL_S): its
                # status is then its batch's manifest line, read when the batch finished (2026-12-06: two
                # cancelled items with no record were counted stuck).
                for b in kept:
                    manifest = (soak.batches[b]["archive"] or {}).get("statuses", {})
                    for job_id in soak.batches[b]["jobs"]:
                        if items.get(job_id) is None and job_id in manifest:
                            items[job_id] = manifest[job_id]
            except redis.RedisError:
                time.sleep(1)
                continue
            if (all(s in FINISHED_STATUSES for s in finished.values())
                    and all(s in FINISHED_STATUSES for s in items.values())
                    and all(soak.batches[b]["archive"] is not None for b in kept)):
                break
            time.sleep(1)
        run_s = time.monotonic() - started
        artifacts = tmp_path / "var" / "artifacts"
        deadline = time.monotonic() + float(RESULT_TTL_S) + 60  # the result TTL, then one reaper pass
        while time.monotonic() < deadline and any(artifacts.glob("job_*")):
            time.sleep(0.5)
        soak.stop.set()
        r = soak.redis()
        batch_lost, batch_stuck, stubs, deleted_alive = [], [], [], []
        for batch_id, info in soak.batches.items():
            if "delete" in info["fate"]:
                gone = soak.request("GET", f"/batches/{batch_id}")
                if gone is None or gone.status_code != 404 or r.exists(f"h3b:batch:{batch_id}"):
                    stubs.append(batch_id)
                deleted_alive += [j for j in info["jobs"] if r.exists(f"h3b:job:{j}")]
                continue
            allowed = ("completed", "expired") + (("cancelled",) if info["fate"] == "cancel" else ())
            batch_lost += [j for j in info["jobs"] if items.get(j) not in allowed and items.get(j) in
                           FINISHED_STATUSES]
            batch_stuck += [j for j in info["jobs"] if items.get(j) not in FINISHED_STATUSES]
            if info["archive"] is None:
                batch_stuck.append(batch_id)
        archives = [info["archive"] for info in soak.batches.values() if info["archive"] is not None]
        all_items = [j for info in soak.batches.values() for j in info["jobs"]]
        completed_twice = [j for j in soak.accepted + all_items
                           if sum(1 for _, f in r.xrange(f"h3b:events:{j}") if f.get("event") == "completed") > 1]
        rendered_twice = [j for j in soak.accepted + all_items if int(r.hget(f"h3b:runs:{j}", "rendered") or 0) > 1]
        lost = [j for j, s in finished.items() if s not in ("completed", "expired")]
        stuck = [j for j, s in finished.items() if s in ("queued", "in_progress")]
        disk_left = sum(p.stat().st_size for p in artifacts.rglob("*") if p.is_file())
        quiet = {name: [mb for n, mb in samples if n >= JOBS * (1 - QUIET_SHARE) and mb > 0]
                 for name, samples in soak.rss.items()}
        quiet = {name: window[len(window) // 5:] for name, window in quiet.items()}  # past any warm-up
        report = {"jobs": JOBS, "accepted": len(soak.accepted), "lost": len(lost), "completed_twice":
                  len(completed_twice), "rendered_twice": len(rendered_twice), "stuck": len(stuck),
                  "unexpected_5xx": len(soak.errors_5xx), "designed_503": soak.answers_503, **soak.faults,
                  "batches": len(soak.batches), "batch_items": len(all_items),
                  "batch_fates": {f: sum(1 for i in soak.batches.values() if i["fate"] == f) for f in set(FATES)},
                  "race_answers": sorted({f"{a}:{c}" for i in soak.batches.values() for a, c in i["answers"]}),
                  "batch_items_lost": len(batch_lost), "batch_stuck": len(batch_stuck),
                  "deleted_batch_stubs": len(stubs), "deleted_batch_jobs_left": len(deleted_alive),
                  "archives": len(archives), "archive_members": sum(a["members"] for a in archives),
                  "archive_completed_items": sum(a["completed"] for a in archives),
                  "archive_items_expired_first": sum(a["expired"] for a in archives),
                  "archive_members_missing": sum(a["completed"] + 1 - a["members"] for a in archives),
                  "archive_names_repeated": sum(a["members"] - a["unique"] for a in archives),
                  "peak_rss_mb": {k: round(max((mb for _, mb in v), default=0), 1) for k, v in soak.rss.items()},
                  "quiet_rss_mb": {k: [round(v[0], 1), round(v[-1], 1)] if v else None for k, v in quiet.items()},
                  "disk_left_bytes": disk_left, "run_s": round(run_s, 1)}
        print("SOAK " + json.dumps(report))
        (tmp_path / "soak.json").write_text(json.dumps(report, indent=2))
    finally:
        soak.stop.set()
        if soak.proc.poll() is None:
            soak.proc.send_signal(signal.SIGINT)
            try:
                soak.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(soak.proc.pid, signal.SIGKILL)
                soak.proc.wait()
        soak.out.close()
    assert len(soak.accepted) == JOBS and len(soak.batches) == BATCHES, report
    assert not lost and not completed_twice and not stuck, (report, lost, stuck)
    assert not batch_lost and not batch_stuck and not stubs and not deleted_alive, (report, batch_lost, batch_stuck)
    assert report["archive_members_missing"] == 0 and report["archive_names_repeated"] == 0, report
    assert not soak.errors_5xx, soak.errors_5xx[:5]
    assert disk_left == 0, report
    for name, window in quiet.items():
        if len(window) >= 2:  # flat: the quiet phase grows by less than a quarter (plus 64 MB of allocator slack)
            assert window[-1] <= window[0] * 1.25 + 64, (name, window[0], window[-1])
