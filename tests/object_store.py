"""A real S3-compatible server for tests: moto's standalone server (`python -m moto.server`) on a free loopback port,
with a bucket, and the environment that points an h3batch API or worker at it.

    from tests.object_store import MotoServer, s3_env
    server = MotoServer.start(tmp_path / "moto.log")        # or the `object_store` module fixture below
    env = service_env(redis_url, artifacts, **server.env())  # H3BATCH_ARTIFACT_STORE, endpoint, AWS_* keys
    ...
    server.stop()

`MotoServer.start(..., auth=True)` turns on moto's IAM checks (INITIAL_NO_AUTH_ACTION_COUNT) and makes a real access
key for an IAM user allowed s3:*, so wrong credentials are refused with 403 (moto then refuses presigned URLs too,
so the default is off). Nothing here is a mock: boto3 talks HTTP to the server process.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

BUCKET = "h3batch-test"
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class MotoServer:
    proc: subprocess.Popen
    endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    log_path: Path

    @classmethod
    def start(cls, log_path: Path, *, bucket: str = BUCKET, auth: bool = False, port: int | None = None,
              keys: tuple[str, str] | None = None) -> MotoServer:
        port = port or _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "H3BATCH_"))}
        if auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"  # create bucket, user, policy, access key; then IAM checks
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            proc = subprocess.Popen([sys.executable, "-P", "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                    env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"moto server exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    proc.kill()
                    pytest.fail("moto server did not listen within 30 s")
                time.sleep(0.05)
        access, secret = keys or ("AKIA" + secrets.token_hex(8).upper(), "test-secret-" + secrets.token_hex(16))
        import boto3  # noqa: PLC0415

        boot = dict(endpoint_url=endpoint, region_name=REGION, aws_access_key_id=access,
                    aws_secret_access_key=secret)
        client_s3(endpoint, access, secret).create_bucket(Bucket=bucket)
        if auth:
            iam = boto3.client("iam", **boot)
            iam.create_user(UserName="h3batch")
            iam.put_user_policy(UserName="h3batch", PolicyName="s3", PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
            key = iam.create_access_key(UserName="h3batch")["AccessKey"]
            access, secret = key["AccessKeyId"], key["SecretAccessKey"]
        return cls(proc=proc, endpoint=endpoint, bucket=bucket, access_key=access, secret_key=secret,
                   log_path=log_path)

    def env(self, prefix: str = "jobs", **extra: str) -> dict[str, str]:
        """Environment for an h3batch process using this server as its artifact store."""
        return s3_env(self.endpoint, self.bucket, self.access_key, self.secret_key, prefix=prefix, **extra)

    def client(self):
        """A boto3 S3 client on this server (for tests to look into the bucket)."""
        return client_s3(self.endpoint, self.access_key, self.secret_key)

    def keys(self, prefix: str = "") -> list[str]:
        found = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            found += [obj["Key"] for obj in page.get("Contents", [])]
        return sorted(found)

    def kill(self) -> None:
        """SIGKILL: the store vanishes mid-whatever (moto keeps everything in memory: the bucket goes too)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        """Start again on the same port with the same bucket and keys (empty: moto keeps nothing)."""
        self.kill()
        port = int(self.endpoint.rsplit(":", 1)[1])
        fresh = MotoServer.start(self.log_path, bucket=self.bucket, port=port,
                                 keys=(self.access_key, self.secret_key))
        self.proc = fresh.proc

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def client_s3(endpoint: str, access: str, secret: str):
    import boto3  # noqa: PLC0415
    from botocore.config import Config  # noqa: PLC0415

    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=access,
                        aws_secret_access_key=secret,
                        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))


def s3_env(endpoint: str, bucket: str, access: str, secret: str, *, prefix: str = "jobs",
           **extra: str) -> dict[str, str]:
    """H3BATCH_ARTIFACT_STORE / H3BATCH_S3_ENDPOINT_URL and the standard AWS variables for one store."""
    return {"H3BATCH_ARTIFACT_STORE": f"s3://{bucket}/{prefix}", "H3BATCH_S3_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": REGION, **extra}


@pytest.fixture(scope="module")
def object_store(tmp_path_factory) -> MotoServer:
    """One moto S3 server per test module, bucket `h3batch-test` made (credentials not checked)."""
    server = MotoServer.start(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()
