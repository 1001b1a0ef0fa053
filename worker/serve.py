"""`h3batch serve [--port 8000]`: run Redis (if needed), the API and one worker locally until Ctrl-C.

`LocalStack` is the shared part of `serve` and `demo`: it builds the tiny release under ./var if the default one is
absent, uses H3BATCH_REDIS_URL when set and otherwise starts its own `redis-server` with its data in ./var/redis and
AOF on (`appendfsync everysec`), so queued jobs survive a restart of the stack. It never uses whatever happens to
answer on 127.0.0.1:6379 (another project's DB 0, without persistence). It starts `h3batch worker` and `h3batch api`
as subprocesses with their logs in ./var/logs, waits until /readyz says a worker is consuming, and on exit (normal,
error or Ctrl-C) stops everything it started and nothing else.

While `serve` runs, `supervise()` restarts a child that died (a worker killed by the OOM killer, an API crash, the
watchdog's or run deadline's exit 75), as compose's `restart: unless-stopped` does; a child that dies more than
`MAX_RESTARTS` times in `RESTART_WINDOW_S` is a crash loop and stops the stack with its last log lines.
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
from h3batch.core.startup_checks import check_redis
from h3batch.settings import env_value

VAR = Path("var")
H3BATCH = [sys.executable, "-P", "-m", "h3batch.cli"]
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


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
        # Unset variables mean "under var/" here, not the service defaults: the local stack keeps its state together.
        env_release = env_value("H3BATCH_RELEASE")
        self.release = Path(env_release) if env_release else var_dir / "tiny-release"  # a directory here
        self.build_if_absent = env_release is None
        self.hf_cache = env_value("H3BATCH_HF_CACHE") or self.release.parent / "hf-cache"
        self.artifacts = env_value("H3BATCH_ARTIFACTS_DIR") or var_dir / "artifacts"
        self.logs = var_dir / "logs"
        self.redis_url = ""
        self._children: list[tuple[str, subprocess.Popen]] = []
        self._procs: dict[str, subprocess.Popen] = {}  # the live process of each child name
        self._args: dict[str, list[str]] = {}
        self._redis_args: list[str] = []
        self._restarts: dict[str, list[float]] = {}

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
        env_url = env_value("H3BATCH_REDIS_URL")
        if env_url:
            check_redis(env_url)
            self.redis_url = env_url
            return
        exe = shutil.which("redis-server")
        if exe is None:
            raise ConfigError("no Redis: H3BATCH_REDIS_URL is unset and redis-server is not installed "
                              "(Debian/Ubuntu package: redis-server)")
        port = _free_port()
        redis_dir = (self.var / "redis").resolve()
        redis_dir.mkdir(parents=True, exist_ok=True)
        self._redis_args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(redis_dir), "--save", "",
                            "--appendonly", "yes", "--appendfsync", "everysec", "--loglevel", "warning",
                            "--logfile", str(redis_dir / "redis.log")]
        self._start_redis()
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 30  # an AOF of many jobs takes a moment to replay
        proc = self._procs["redis-server"]
        while True:
            try:
                check_redis(url, timeout_s=0.5)
                break
            except ConfigError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise ConfigError(f"the private redis-server on port {port} did not start") from None
                time.sleep(0.1)
        self.redis_url = url
        _say(f"started a private redis-server on 127.0.0.1:{port} (data and AOF in {redis_dir})")

    def _start_redis(self) -> None:
        proc = subprocess.Popen(self._redis_args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        self._procs["redis-server"] = proc
        self._children.insert(0, ("redis-server", proc))  # stopped last

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(H3BATCH_REDIS_URL=self.redis_url, H3BATCH_RELEASE=str(self.release),
                   H3BATCH_HF_CACHE=str(self.hf_cache), H3BATCH_ARTIFACTS_DIR=str(self.artifacts),
                   PYTHONUNBUFFERED="1")
        env.setdefault("H3BATCH_SWEEP_ALLOW_LOOPBACK", "1")  # the local demo's sweeps aim at a local duplex server
        if self.build_if_absent:
            env.setdefault("HF_HUB_OFFLINE", "1")  # the tiny release's base VAE is in the local cache
        return env

    def _spawn(self, name: str, args: list[str]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(H3BATCH + args, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # Ctrl-C reaches us; we stop the children in order
        self._children.append((name, proc))
        self._procs[name], self._args[name] = proc, args
        _say(f"{name} started pid={proc.pid}")

    def _log_tail(self, name: str, lines: int = 5) -> str:
        path = self.logs / f"{name}.log"
        text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
        return " | ".join(text[-lines:])

    def check_children(self) -> None:
        """Raise ConfigError naming the first child that exited (start-up, `demo`: a dead child is an error)."""
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise ConfigError(f"{name} exited with code {proc.returncode}: {self._log_tail(name)}")

    def supervise(self) -> list[str]:
        """Start again each child that exited (Redis first, on its port and data dir); returns their names.
        Raises ConfigError when one dies more than MAX_RESTARTS times within RESTART_WINDOW_S."""
        restarted = []
        for name in list(self._procs):
            proc = self._procs[name]
            if proc.poll() is None:
                continue
            now = time.monotonic()
            recent = [t for t in self._restarts.get(name, []) if now - t < RESTART_WINDOW_S] + [now]
            self._restarts[name] = recent
            if len(recent) > MAX_RESTARTS:
                raise ConfigError(f"{name} exited with code {proc.returncode} {len(recent)} times within "
                                  f"{RESTART_WINDOW_S:.0f} s: {self._log_tail(name)}")
            _say(f"{name} exited with code {proc.returncode}; restarting it")
            self._children = [(n, p) for n, p in self._children if p is not proc]
            if name == "redis-server":
                self._start_redis()
            else:
                self._spawn(name, self._args[name])
            restarted.append(name)
        return restarted

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
        self._procs.clear()


def _sigterm_as_interrupt(*_args) -> None:
    raise KeyboardInterrupt


def stop_on_interrupt_signals() -> None:
    """SIGINT and SIGTERM both raise KeyboardInterrupt here, however the process was started.

    Python maps SIGINT to KeyboardInterrupt only when the parent left it at its default: a background job of a
    non-interactive shell (`h3batch serve &` in a script or a CI step) inherits SIGINT ignored, and then
    `kill -INT` would never stop the stack. Servers (redis-server, gunicorn, Celery) take SIGINT themselves for the
    same reason, so `serve` and `demo` do too."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)


def main(argv: list[str]) -> int:
    parser = OneLineArgumentParser(prog="h3batch serve", description="Run Redis (if needed), API and worker.")
    parser.add_argument("--port", type=int, default=8000, help="API port (default 8000)")
    args = parser.parse_args(argv)
    stop_on_interrupt_signals()
    try:
        with LocalStack(port=args.port) as stack:
            _say(f"ready: {stack.base_url}  (Ctrl-C stops API, worker and anything started here)")
            example = json.dumps({"prompt": "rain on a tin roof", "seconds": defaults.DEFAULT_SECONDS})
            _say(f"try: curl -s -H 'Content-Type: application/json' -d '{example}' {stack.base_url}/jobs")
            while True:
                stack.supervise()
                time.sleep(0.5)
    except ConfigError as exc:
        print(f"h3batch serve: {exc}", file=sys.stderr)
        return 2 if "exited with code" not in str(exc) else 1
    except KeyboardInterrupt:
        _say("stopped")
        return 0
