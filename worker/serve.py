"""`h3batch serve [--port 8000]`: run Redis (if needed), the API and one worker locally until Ctrl-C.

`LocalStack` is the shared part of `serve` and `demo`: it builds the tiny release under ./var if the default one is
absent, picks a Redis (H3BATCH_REDIS_URL, else 127.0.0.1:6379 when it answers, else a private `redis-server`),
starts `h3batch worker` and `h3batch api` as subprocesses with their logs in ./var/logs, waits until /readyz says
a worker is consuming, and on exit (normal, error or Ctrl-C) stops everything it started and nothing else.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from h3batch.cli_args import OneLineArgumentParser
from h3batch.core import defaults
from h3batch.core.exceptions import ConfigError
from h3batch.settings import check_redis

VAR = Path("var")
LOCAL_REDIS = "redis://127.0.0.1:6379/0"
H3BATCH = [sys.executable, "-m", "h3batch.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _say(message: str) -> None:
    print(f"h3batch: {message}", flush=True)


class LocalStack:
    """Redis + `h3batch worker` + `h3batch api` on this machine, as a context manager."""

    def __init__(self, port: int | None = None, var_dir: Path = VAR):
        self.var = var_dir
        self.port = port or _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        env_release = os.environ.get("H3BATCH_RELEASE", "").strip()
        self.release = Path(env_release) if env_release else var_dir / "tiny-release"
        self.build_if_absent = not env_release
        env_cache = os.environ.get("H3BATCH_HF_CACHE", "").strip()
        self.hf_cache = Path(env_cache) if env_cache else self.release.parent / "hf-cache"
        self.artifacts = Path(os.environ.get("H3BATCH_ARTIFACTS_DIR", "").strip() or var_dir / "artifacts")
        self.logs = var_dir / "logs"
        self.redis_url = ""
        self._children: list[tuple[str, subprocess.Popen]] = []

    # --- pieces ---

    def _ensure_release(self) -> None:
        if self.release.is_dir():
            return
        if not self.build_if_absent:
            raise ConfigError(f"H3BATCH_RELEASE: expected a release directory, found {str(self.release)!r} "
                              f"(no such directory)")
        _say(f"building the tiny release into {self.release} (once; about 15 s)")
        done = subprocess.run(H3BATCH + ["build-tiny", "--out", str(self.release), "--hf-cache", str(self.hf_cache)],
                              env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise ConfigError(f"h3batch build-tiny failed: {last}")

    def _pick_redis(self) -> None:
        env_url = os.environ.get("H3BATCH_REDIS_URL", "").strip()
        if env_url:
            check_redis(env_url)
            self.redis_url = env_url
            return
        try:
            check_redis(LOCAL_REDIS, timeout_s=0.5)
            self.redis_url = LOCAL_REDIS
            _say("using the Redis at 127.0.0.1:6379")
            return
        except ConfigError:
            pass
        exe = shutil.which("redis-server")
        if exe is None:
            raise ConfigError("no Redis: H3BATCH_REDIS_URL is unset, nothing answers on 127.0.0.1:6379 and "
                              "redis-server is not installed (Debian/Ubuntu package: redis-server)")
        port = _free_port()
        redis_dir = self.var / "redis"
        redis_dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(redis_dir),
                                 "--save", "", "--appendonly", "no", "--loglevel", "warning"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._children.append(("redis-server", proc))
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                check_redis(url, timeout_s=0.5)
                break
            except ConfigError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise ConfigError(f"the private redis-server on port {port} did not start") from None
                time.sleep(0.1)
        self.redis_url = url
        _say(f"started a private redis-server on 127.0.0.1:{port}")

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(H3BATCH_REDIS_URL=self.redis_url, H3BATCH_RELEASE=str(self.release),
                   H3BATCH_HF_CACHE=str(self.hf_cache), H3BATCH_ARTIFACTS_DIR=str(self.artifacts),
                   PYTHONUNBUFFERED="1")
        if self.build_if_absent:
            env.setdefault("HF_HUB_OFFLINE", "1")  # the tiny release's base VAE is in the local cache
        return env

    def _spawn(self, name: str, args: list[str]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(H3BATCH + args, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # Ctrl-C reaches us; we stop the children in order
        self._children.append((name, proc))

    def _log_tail(self, name: str, lines: int = 5) -> str:
        path = self.logs / f"{name}.log"
        text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
        return " | ".join(text[-lines:])

    def check_children(self) -> None:
        """Raise ConfigError naming the first child that exited."""
        for name, proc in self._children:
            if proc.poll() is not None:
                raise ConfigError(f"{name} exited with code {proc.returncode}: {self._log_tail(name)}")

    def _wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_children()
            try:
                with urllib.request.urlopen(self.base_url + "/readyz", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise ConfigError(f"the API/worker were not ready within {timeout_s:.0f} s (logs in {self.logs})")

    # --- context manager ---

    def __enter__(self) -> "LocalStack":
        try:
            self._ensure_release()
            self._pick_redis()
            _say(f"starting worker (release {self.release}) and API on {self.base_url}; logs in {self.logs}")
            self._spawn("worker", ["worker"])
            self._spawn("api", ["api", "--port", str(self.port)])
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM each child's process group (API first, Redis last), SIGKILL what is still alive after 20 s."""
        for name, proc in reversed(self._children):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 20
        for name, proc in reversed(self._children):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._children.clear()


def _sigterm_as_interrupt(*_args) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    parser = OneLineArgumentParser(prog="h3batch serve", description="Run Redis (if needed), API and worker.")
    parser.add_argument("--port", type=int, default=8000, help="API port (default 8000)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        with LocalStack(port=args.port) as stack:
            _say(f"ready: {stack.base_url}  (Ctrl-C stops API, worker and anything started here)")
            example = json.dumps({"prompt": "rain on a tin roof", "seconds": defaults.DEFAULT_SECONDS})
            _say(f"try: curl -s -H 'Content-Type: application/json' -d '{example}' {stack.base_url}/jobs")
            while True:
                stack.check_children()
                time.sleep(1.0)
    except ConfigError as exc:
        print(f"h3batch serve: {exc}", file=sys.stderr)
        return 2 if "exited with code" not in str(exc) else 1
    except KeyboardInterrupt:
        _say("stopped")
        return 0
