"""Misconfiguration stops `h3batch api` / `h3batch worker` at start with exit 2 and one clear line, no traceback."""
from __future__ import annotations

import subprocess

import pytest

from tests.service_stack import H3BATCH, REPO, free_port, service_env


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(H3BATCH + args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def assert_one_line_exit_2(done: subprocess.CompletedProcess, *needles: str) -> None:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("command", ["api", "worker"])
def test_unreachable_redis_exits_2_naming_the_variable(command, tmp_path):
    """A Redis URL nobody answers on stops the process with one line naming H3BATCH_REDIS_URL."""
    env = service_env(f"redis://127.0.0.1:{free_port()}/0", tmp_path / "art", H3BATCH_RELEASE=str(tmp_path))
    assert_one_line_exit_2(run_cli([command], env), "H3BATCH_REDIS_URL", "not reachable")


def test_redis_password_is_not_printed(tmp_path):
    """The one-line Redis error redacts a password in the URL."""
    env = service_env(f"redis://:hunter2secret@127.0.0.1:{free_port()}/0", tmp_path / "art")
    done = run_cli(["api"], env)
    assert_one_line_exit_2(done, "H3BATCH_REDIS_URL")
    assert "hunter2secret" not in done.stderr


def test_missing_release_exits_2(redis_url, tmp_path):
    """A worker pointed at a release directory that does not exist stops with one line naming H3BATCH_RELEASE."""
    env = service_env(redis_url, tmp_path / "art", H3BATCH_RELEASE=str(tmp_path / "no-such-release"))
    assert_one_line_exit_2(run_cli(["worker"], env), "H3BATCH_RELEASE", "no-such-release")


@pytest.mark.parametrize("command", ["api", "worker"])
def test_unwritable_artifacts_dir_exits_2(command, redis_url, tmp_path):
    """An artifacts path that cannot be a directory (its parent is a file) stops with one line naming the variable."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = service_env(redis_url, blocker / "artifacts", H3BATCH_RELEASE=str(tmp_path))
    assert_one_line_exit_2(run_cli([command], env), "H3BATCH_ARTIFACTS_DIR")


def test_bad_number_in_env_exits_2(redis_url, tmp_path):
    """A non-integer H3BATCH_MAX_RUN_S is reported as expected-vs-found in one line."""
    env = service_env(redis_url, tmp_path / "art", H3BATCH_MAX_RUN_S="ten minutes")
    assert_one_line_exit_2(run_cli(["api"], env), "H3BATCH_MAX_RUN_S", "expected an integer", "ten minutes")


def test_bad_rank_count_exits_2(redis_url, tmp_path):
    """A worker asked for 0 sequence-parallel ranks stops with one line naming H3BATCH_RANKS."""
    env = service_env(redis_url, tmp_path / "art", H3BATCH_RANKS="0")
    assert_one_line_exit_2(run_cli(["worker"], env), "H3BATCH_RANKS", "positive integer")


def test_bad_port_argument_exits_2(redis_url, tmp_path):
    """An unparsable --port is one line, exit 2 (not argparse's two-line usage dump)."""
    env = service_env(redis_url, tmp_path / "art")
    assert_one_line_exit_2(run_cli(["api", "--port", "eighty"], env), "--port")


def test_legacy_adapter_on_a_v2_release_exits_2(redis_url, tiny_release, tmp_path):
    """H3BATCH_ADAPTER on the (V2) tiny release stops the worker at start (exit 2) with one error line naming the variable and why:
    V2 is a full checkpoint, the adapter edits the native base."""
    from h3batch.worker.h3.config import T2
    from h3batch.worker.h3.tiny_adapters import write_tiny_legacy_adapter

    adapter = write_tiny_legacy_adapter(tmp_path / "legacy-fasth3", T2)
    env = service_env(redis_url, tmp_path / "art", H3BATCH_RELEASE=str(tiny_release), H3BATCH_ADAPTER=str(adapter))
    done = run_cli(["worker"], env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    refusal = [line for line in done.stderr.splitlines() if line.startswith("h3batch worker: ")]
    assert len(refusal) == 1 and refusal[0].startswith("h3batch worker: H3BATCH_ADAPTER: the served release is 'v2'")
    assert "native MiniMax-H3 release only" in refusal[0]
