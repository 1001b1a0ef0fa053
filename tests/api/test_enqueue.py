"""api/enqueue.py: nothing is built or read at import; each Flask app gets its own sender from its own config, and
the message it publishes is the render task by name with only the job id."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import redis

from h3batch.api import create_app
from h3batch.api.enqueue import enqueue_render
from h3batch.core import broker, defaults, jobs, lanes, routing
from tests.service_stack import REPO

FORBIDDEN = ("torch", "triton", "diffusers", "transformers", "h3batch.worker")


def test_importing_the_api_builds_no_celery_app_and_reads_no_environment():
    """With an unparsable H3BATCH_MAX_RUN_S, importing the API still works and builds no Celery app; building the
    app and serving /openapi.json imports none of torch, triton, diffusers, transformers, h3batch.worker or the
    worker's Celery app."""
    code = ("import sys, celery._state as s; import h3batch.api, h3batch.api.enqueue, h3batch.api.jobs, "
            "h3batch.api.openai_videos; print(len(list(s._get_active_apps()))); "
            "from h3batch.api import create_app; import os; os.environ.pop('H3BATCH_MAX_RUN_S'); "
            "app = create_app({'TESTING': True}); app.test_client().get('/openapi.json'); "
            f"print([m for m in sys.modules if m.startswith({FORBIDDEN!r})])")
    env = {k: v for k, v in os.environ.items() if not k.startswith("H3BATCH_")}
    env["H3BATCH_MAX_RUN_S"] = "not-a-number"
    done = subprocess.run([sys.executable, "-P", "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["0", "[]"], done.stdout


def _render_messages(url: str, queue: str) -> list[dict]:
    """The messages waiting on `queue`, every priority list (an interactive job's go to priority 3: core/lanes.py)."""
    client = redis.Redis.from_url(url)
    try:
        return [json.loads(raw) for name in broker.ready_lists(queue) for raw in client.lrange(name, 0, -1)]
    finally:
        client.close()


def _job(url: str, **spec) -> dict:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return jobs.create_job(client, jobs.JobSpec(prompt="a", seconds=4.0, width=256, height=128, seed=1, **spec))
    finally:
        client.close()


def test_each_app_sends_on_its_own_redis_with_its_own_run_limit(redis_url, tmp_path):
    """Two apps on two Redis databases each publish `h3batch.render(job_id)` (JSON, nothing else in the body) to
    their own database, on the job's capability queue (t2va in bf16 or fp8, 2,404 rows: step 2,436), through a
    sender made once per app with a visibility timeout of twice its MAX_RUN_S."""
    base = redis_url.rsplit("/", 1)[0]
    urls = [f"{base}/7", f"{base}/8"]
    for url in urls:
        redis.Redis.from_url(url).flushdb()
    apps = [create_app({"TESTING": True, "REDIS_URL": url, "ARTIFACTS_DIR": str(tmp_path), "MAX_RUN_S": run_s})
            for url, run_s in zip(urls, (100, 250), strict=True)]
    try:
        made = [_job(urls[0]), _job(urls[1], precision="fp8")]
        for app, job in zip(apps, made, strict=True):
            with app.app_context():
                enqueue_render(job["id"])
                enqueue_render(job["id"])
                enqueue_render("job_gone")  # no record: nothing to render, nothing sent
        for url, job, queue in zip(urls, made, ("render.t2va.bf16.2436", "render.t2va.fp8.2436"), strict=True):
            job_id = job["id"]
            assert routing.queue_of(job) == queue
            messages = _render_messages(url, queue)
            assert len(messages) == 2 and redis.Redis.from_url(url).llen(defaults.RENDER_QUEUE) == 0
            for message in messages:
                assert message["headers"]["task"] == defaults.RENDER_TASK
                assert message["content-type"] == "application/json"
                assert message["properties"]["priority"] == lanes.MESSAGE_PRIORITY
                args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
                assert args == [job_id] and kwargs == {}
        senders = [app.extensions["h3batch.celery"] for app in apps]
        assert senders[0] is not senders[1]
        assert [s.conf.broker_transport_options["visibility_timeout"] for s in senders] == [200, 500]
        assert [s.conf.broker_url for s in senders] == urls
    finally:
        for url in urls:
            redis.Redis.from_url(url).flushdb()
