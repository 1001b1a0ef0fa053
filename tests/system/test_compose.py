"""docker-compose.yml checked statically (no Docker engine here): structure, build files, healthchecks, Redis
durability flags, GPU pinning, and every environment variable documented in docs/service.md."""
from __future__ import annotations

import re

import pytest
import yaml

from h3batch.settings import VARS
from tests.service_stack import REPO

COMPOSE = REPO / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def documented_variables() -> set[str]:
    """Variable names in the first column of docs/service.md's configuration table."""
    text = (REPO / "docs" / "service.md").read_text()
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", text, flags=re.MULTILINE))


def test_services_volumes_and_include(compose):
    """The file defines redis, api and gpu-worker, three named volumes, and includes the load runner's file."""
    assert {"redis", "api", "gpu-worker"} <= set(compose["services"])
    assert {"redis-data", "artifacts", "model-cache"} <= set(compose["volumes"])
    included = [REPO / entry if isinstance(entry, str) else REPO / entry["path"] for entry in compose["include"]]
    assert REPO / "docker" / "compose.loadrunner.yml" in included
    for path in included:
        assert path.is_file(), f"included compose file {path} does not exist"
        assert isinstance(yaml.safe_load(path.read_text()).get("services"), dict), path


def test_build_contexts_and_dockerfiles_exist(compose):
    """Every build context is a directory, every Dockerfile it names exists with the target it asks for, and each
    COPY source exists; the API image installs no torch and the project --no-deps."""
    for name, service in compose["services"].items():
        build = service.get("build")
        if build is None:
            continue
        context = REPO / (build if isinstance(build, str) else build.get("context", "."))
        assert context.is_dir(), name
        dockerfile = context / (build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile")
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        text = dockerfile.read_text()
        if isinstance(build, dict) and build.get("target"):
            assert re.search(rf"^FROM \S+ AS {re.escape(build['target'])}$", text, re.MULTILINE), name
        for source in re.findall(r"^COPY\s+(?!--from)(?:--\S+\s+)*(\S+)", text, flags=re.MULTILINE):
            assert (context / source).exists(), f"{name}: COPY source {source} missing"
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    api_stage = dockerfile.split("AS api\n", 1)[1].split("\nFROM ", 1)[0]
    requirements = (REPO / "docker" / "requirements" / "api.txt").read_text().splitlines()
    assert not [line for line in requirements if "torch" in line and not line.lstrip().startswith("#")]
    assert "docker/requirements/api.txt" in api_stage and "--no-deps /dist/" in api_stage


def test_every_service_has_a_healthcheck_and_depends_on_healthy_redis(compose):
    """Each long-running service has a healthcheck test (a one-shot job, `restart: "no"`, exits instead); api and
    gpu-worker wait for Redis to be healthy."""
    for name, service in compose["services"].items():
        if service.get("restart") == "no":
            assert "healthcheck" not in service, f"one-shot {name} has a healthcheck"
            continue
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name in ("api", "gpu-worker"):
        assert compose["services"][name]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert any("/healthz" in part for part in compose["services"]["api"]["healthcheck"]["test"])


def test_redis_is_durable_and_never_evicts(compose):
    """Redis runs with AOF, appendfsync everysec, noeviction, a data volume, and no published port."""
    redis_service = compose["services"]["redis"]
    command = " ".join(redis_service["command"])
    for flag in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"):
        assert flag in command
    assert any(v.endswith(":/data") for v in redis_service["volumes"])
    assert "ports" not in redis_service


def test_gpu_worker_is_pinned_to_four_gpus_with_volumes(compose):
    """The worker reserves GPUs 0-3 explicitly, mounts model cache and artifacts, and has a long stop grace."""
    worker = compose["services"]["gpu-worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["device_ids"] == ["0", "1", "2", "3"]
    assert worker["environment"]["NVIDIA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert worker["environment"]["H3BATCH_RANKS"] == "4"  # one sequence-parallel rank per pinned GPU
    assert worker["shm_size"] and worker["ulimits"]["memlock"] == -1  # NCCL needs shared memory and pinned pages
    mounts = {v.split(":")[1] for v in worker["volumes"]}
    assert {"/models", "/artifacts"} <= mounts
    assert worker["stop_grace_period"] == "90s"


def test_every_variable_is_documented(compose):
    """Each environment key and ${VAR} in the compose file, and each H3BATCH_* setting, is in the docs table."""
    documented = documented_variables()
    used = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", COMPOSE.read_text()))
    for service in compose["services"].values():
        used |= set(service.get("environment") or {})
    used |= {var.name for var in VARS}
    missing = sorted(used - documented)
    assert not missing, f"undocumented in docs/service.md: {missing}"


def test_ops_profile_runs_flower_for_both_apps_and_prometheus_scraping_the_api(compose):
    """Profile `ops` holds the two Flowers (render app by broker URL, sweep app by -A) and Prometheus, each published
    on loopback only; Prometheus sends the API's metrics token from the compose secret that carries
    H3BATCH_METRICS_TOKEN, which the API is given too; the default `compose up` starts none of them."""
    services = compose["services"]
    ops = {name for name, service in services.items() if "ops" in service.get("profiles", [])}
    assert ops == {"flower", "flower-sweeps", "prometheus"}
    profiled = {name for name, service in services.items() if service.get("profiles")}
    assert profiled == ops | {"minio", "minio-init"}
    for name in ops:
        assert all(str(port).startswith("127.0.0.1:") for port in services[name]["ports"]), name
    assert "--broker=redis://redis:6379/0" in services["flower"]["command"]
    assert services["flower"]["command"][services["flower"]["command"].index("--broker=redis://redis:6379/0") + 1] \
        == "flower"
    assert services["flower-sweeps"]["command"][:3] == ["celery", "-A", "h3batch.loadrunner.celery_app"]
    for name in ("flower", "flower-sweeps"):
        assert "--read-only" in services[name]["command"] and "FLOWER_BASIC_AUTH" in services[name]["environment"]
    prometheus = services["prometheus"]
    config_mount = next(v for v in prometheus["volumes"] if v.endswith(":/etc/prometheus/prometheus.yml:ro"))
    config = yaml.safe_load((REPO / config_mount.split(":")[0]).read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    api_job = jobs["h3batch-api"]
    assert api_job["metrics_path"] == "/metrics"
    assert api_job["static_configs"][0]["targets"] == ["api:8000"]
    (secret,) = prometheus["secrets"]
    assert api_job["authorization"] == {"type": "Bearer", "credentials_file": f"/run/secrets/{secret}"}
    assert compose["secrets"][secret] == {"environment": "H3BATCH_METRICS_TOKEN"}
    assert services["api"]["environment"]["H3BATCH_METRICS_TOKEN"] == "${H3BATCH_METRICS_TOKEN:-}"
    flower_targets = {t for group in jobs["flower"]["static_configs"] for t in group["targets"]}
    assert flower_targets == {"flower:5555", "flower-sweeps:5555"}


def test_s3_profile_runs_a_minio_whose_bucket_and_keys_the_api_and_worker_use(compose):
    """Profile `s3`: a MinIO whose root user is the AWS key pair the api and gpu-worker get, and a one-shot that
    creates the bucket named by the same H3BATCH_ARTIFACT_STORE; both h3batch services read the store settings."""
    services = compose["services"]
    minio, init = services["minio"], services["minio-init"]
    assert minio["profiles"] == init["profiles"] == ["s3"]
    assert init["depends_on"]["minio"]["condition"] == "service_healthy"
    assert minio["environment"]["MINIO_ROOT_USER"] == init["environment"]["MINIO_ROOT_USER"] \
        == "${AWS_ACCESS_KEY_ID:-}"
    assert "mc mb --ignore-existing" in init["entrypoint"][-1]
    assert init["environment"]["H3BATCH_ARTIFACT_STORE"].startswith("${H3BATCH_ARTIFACT_STORE")
    assert all(str(port).startswith("127.0.0.1:") for port in minio["ports"])
    for name in ("api", "gpu-worker"):
        env = services[name]["environment"]
        for var in ("H3BATCH_ARTIFACT_STORE", "H3BATCH_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                    "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
            assert var in env, f"{name} lacks {var}"
    assert "H3BATCH_ARTIFACT_REDIRECT" in services["api"]["environment"]


def test_the_project_stage_copies_every_package_folder_pyproject_names():
    """The wheel is built from the folders pyproject's package-dir maps; one not copied into the build stage fails
    the image build ('package directory ... does not exist'), as `client/` did when P7 added it."""
    import tomllib  # noqa: PLC0415

    package_dir = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    stage = dockerfile.split(" AS project\n", 1)[1].split("\nFROM ", 1)[0]
    copied = set(re.findall(r"^COPY\s+(?!--from)(\S+)\s+\./\1$", stage, flags=re.MULTILINE))
    assert set(package_dir.values()) <= copied, sorted(set(package_dir.values()) - copied)
