"""The deployment files against the code: deploy/k8s/h3batch.yaml and docker-compose.yml (with the file it includes)
parsed as YAML, every command of an h3batch container resolved and every variable it is given found where it is
read.

- A command is `h3batch SUBCOMMAND ...` with SUBCOMMAND in h3batch/cli.py's table and each `--flag` in that
  subcommand's own `--help`, or `celery [global options] SUBCOMMAND ...` whose global options are celery's, whose
  `-A` names an importable Celery app, whose SUBCOMMAND is registered (flower comes by plugin) and whose flower
  flags are flower's options. Probe commands (`python docker/...`) name a script the image copies.
- A variable is an `H3BATCH_*` declared in h3batch/settings.py (and a literal value of it parses there), an `AWS_*`
  that botocore reads, an `HF_*` that huggingface_hub reads, or one of the third-party names docs/service.md lists
  under "Also used".

Only containers of h3batch's own images are checked this way; redis, MinIO and Prometheus keep their own CLIs.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from h3batch import cli
from h3batch.settings import BY_NAME as SETTINGS
from h3batch.settings import ConfigError, Settings
from tests.service_stack import H3BATCH

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "deploy" / "k8s" / "h3batch.yaml"
COMPOSE = REPO / "docker-compose.yml"
OUR_IMAGES = re.compile(r"(^|/)h3batch-(api|worker|loadrunner)(:|$)")


def load_manifest() -> list[dict]:
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]


def by_kind(docs: list[dict], kind: str, name: str) -> dict:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def load_compose() -> dict[str, dict]:
    """docker-compose.yml's services plus those of the files it includes."""
    compose = yaml.safe_load(COMPOSE.read_text())
    services = dict(compose["services"])
    for entry in compose.get("include", []):
        path = REPO / (entry if isinstance(entry, str) else entry["path"])
        services.update(yaml.safe_load(path.read_text())["services"])
    return services


# --- what the code declares -------------------------------------------------------------------------------------


def also_used_variables() -> set[str]:
    """Third-party variables docs/service.md lists in its "Also used, but not read by h3batch's code" table."""
    text = (REPO / "docs" / "service.md").read_text()
    table = text.split("Also used, but not read by h3batch's code", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", table, flags=re.MULTILINE))


def botocore_variables() -> set[str]:
    """Environment variables botocore reads: credentials (EnvProvider) and its session configuration table."""
    from botocore.configprovider import BOTOCORE_DEFAUT_SESSION_VARIABLES  # noqa: PLC0415
    from botocore.credentials import EnvProvider  # noqa: PLC0415

    names = {EnvProvider.ACCESS_KEY, EnvProvider.SECRET_KEY, *EnvProvider.TOKENS}
    for _, env_names, _, _ in BOTOCORE_DEFAUT_SESSION_VARIABLES.values():
        names.update([env_names] if isinstance(env_names, str) else env_names or [])
    return names


def huggingface_variables() -> set[str]:
    import huggingface_hub.constants  # noqa: PLC0415
    import huggingface_hub.utils._auth  # noqa: PLC0415 - reads HF_TOKEN

    return {name for module in (huggingface_hub.constants, huggingface_hub.utils._auth)
            for name in re.findall(r"\"(HF_[A-Z0-9_]+)\"", Path(module.__file__).read_text())}


def check_variable(name: str, where: str) -> None:
    if name.startswith("H3BATCH_"):
        assert name in SETTINGS, f"{where}: {name} is not declared in h3batch/settings.py"
    elif name.startswith("AWS_"):
        assert name in botocore_variables(), f"{where}: {name} is not a variable botocore reads"
    elif name.startswith("HF_"):
        assert name in huggingface_variables(), f"{where}: {name} is not a variable huggingface_hub reads"
    else:
        assert name in also_used_variables(), f"{where}: {name} is not listed under 'Also used' in docs/service.md"


def check_settings_values(env: dict[str, str], where: str) -> None:
    """The literal H3BATCH_* values parse (blank means unset, as at start)."""
    values = {k: v for k, v in env.items() if k.startswith("H3BATCH_") and k in SETTINGS}
    try:
        Settings.from_env(values)
    except ConfigError as exc:
        pytest.fail(f"{where}: {exc}")


def subcommand_help(name: str) -> str:
    """`h3batch NAME --help`, run in this process (the table's entry imports its room lazily)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), pytest.raises(SystemExit) as exited:
        cli.BY_NAME[name].run(["--help"])
    assert exited.value.code == 0, out.getvalue()
    return out.getvalue()


def check_command(argv: list[str], where: str) -> None:
    assert argv, f"{where}: empty command"
    if argv[0] == "h3batch":
        assert len(argv) > 1 and argv[1] in cli.BY_NAME, f"{where}: {argv[1:2]} is not in h3batch/cli.py's table"
        flags = [a.split("=", 1)[0] for a in argv[2:] if a.startswith("--")]
        if flags:
            text = subcommand_help(argv[1])
            for flag in flags:
                assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", text), f"{where}: h3batch {argv[1]} has no {flag}"
    elif argv[0] == "celery":
        check_celery(argv[1:], where)
    elif argv[0] in ("python", "python3"):
        script = argv[1]
        if script == "-c":
            return
        path = REPO / re.sub(r"^/app/", "", script)
        assert path.is_file(), f"{where}: {script} is not in the repository"
        for target in ("worker-cpu", "worker-cuda"):
            assert re.search(rf"^COPY {re.escape(path.relative_to(REPO).as_posix())} ", dockerfile_stage(target),
                             re.MULTILINE), f"{where}: the {target} image does not copy {script}"
    else:
        pytest.fail(f"{where}: {argv[0]!r} is neither h3batch, celery nor a python probe")


def check_celery(args: list[str], where: str) -> None:
    from celery.app.utils import find_app  # noqa: PLC0415
    from celery.bin.celery import celery as group  # noqa: PLC0415
    from flower.options import options as flower_options  # noqa: PLC0415

    global_opts = {opt for param in group.params for opt in param.opts}
    rest = list(args)
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        name, has_value, value = option.partition("=")
        assert name in global_opts, f"{where}: {name} is not a celery option"
        if not has_value:
            value = rest.pop(0)
        if name in ("-A", "--app"):
            from celery import Celery  # noqa: PLC0415

            assert isinstance(find_app(value), Celery), f"{where}: -A {value} is not a Celery app"
    assert rest and rest[0] in group.commands, f"{where}: celery has no command {rest[:1]}"
    if rest[0] == "flower":
        for option in rest[1:]:
            name = option.lstrip("-").split("=", 1)[0].replace("_", "-")
            assert name in flower_options._options, f"{where}: flower has no option --{name}"


# --- what the build produces -------------------------------------------------------------------------------------

DOCKERFILE = REPO / "docker" / "Dockerfile"


def dockerfile_stage(target: str) -> str:
    """The text of one `FROM ... AS target` stage of docker/Dockerfile."""
    stages = re.split(r"^(?=FROM )", DOCKERFILE.read_text(), flags=re.MULTILINE)
    (stage,) = [s for s in stages if re.match(rf"FROM \S+ AS {re.escape(target)}\n", s)]
    return stage


def stage_cmd(target: str) -> list[str]:
    return yaml.safe_load(re.findall(r"^CMD (\[.*\])$", dockerfile_stage(target), re.MULTILINE)[-1])


def project_version() -> str:
    return re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE).group(1)


def built_images() -> dict[str, str]:
    """image name:tag -> docker/Dockerfile target, for every compose service that builds (CPU override included)."""
    built = {}
    for path in (COMPOSE, REPO / "docker" / "compose.cpu.yml"):
        services = load_compose() if path == COMPOSE else yaml.load(path.read_text(), Loader=ResetLoader)["services"]
        for service in services.values():
            if "build" in service and "target" in service["build"]:
                built[service["image"]] = service["build"]["target"]
    return built


class ResetLoader(yaml.SafeLoader):
    """Reads compose's `!reset` tag (docker/compose.cpu.yml) as the value it carries."""


ResetLoader.add_constructor("!reset", lambda loader, node: None)


# --- the Kubernetes manifest ------------------------------------------------------------------------------------


def container_env(container: dict, docs: list[dict], namespace: str) -> dict[str, str | None]:
    """name → literal value (None when it comes from elsewhere: a field reference) of one container's variables,
    ConfigMap and Secret entries included."""
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            ref = by_kind(docs, "ConfigMap", source["configMapRef"]["name"])
            env.update(ref["data"])
        else:
            ref = by_kind(docs, "Secret", source["secretRef"]["name"])
            env.update(ref.get("stringData", {}))
        assert ref["metadata"]["namespace"] == namespace
    for item in container.get("env", []):
        env[item["name"]] = item.get("value")
    return env


def pod_containers(docs: list[dict]):
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            spec = doc["spec"]["template"]["spec"]
            for container in spec.get("initContainers", []) + spec["containers"]:
                yield doc, container


def test_manifest_shape():
    """A Namespace, a Secret holding the keys and store credentials, Redis with its Service, the API Deployment behind
    a Service, and GPU workers as a StatefulSet with one pod per node (required anti-affinity on the host), four
    GPUs each, as many ranks, a stable name as H3BATCH_WORKER_NAME and a warm-stop grace period."""
    docs = load_manifest()
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    assert namespaces == {"h3batch"} and all(d["metadata"].get("namespace") == "h3batch"
                                             for d in docs if d["kind"] != "Namespace")
    secret = by_kind(docs, "Secret", "h3batch-secrets")["stringData"]
    assert {"H3BATCH_API_KEYS", "H3BATCH_METRICS_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(secret)
    config = by_kind(docs, "ConfigMap", "h3batch-config")["data"]
    assert not {"H3BATCH_API_KEYS", "AWS_SECRET_ACCESS_KEY"} & set(config), "secrets belong in the Secret"
    assert config["H3BATCH_REDIS_URL"] == "redis://redis:6379/0" and config["H3BATCH_ARTIFACT_STORE"].startswith("s3://")
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert services["redis"]["spec"]["ports"][0]["port"] == 6379
    api = by_kind(docs, "Deployment", "api")
    assert services["api"]["spec"]["selector"] == api["spec"]["template"]["metadata"]["labels"]
    (api_container,) = api["spec"]["template"]["spec"]["containers"]
    assert services["api"]["spec"]["ports"][0]["targetPort"] == api_container["ports"][0]["containerPort"]
    assert api_container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    redis_set = by_kind(docs, "StatefulSet", "redis")
    redis_command = " ".join(redis_set["spec"]["template"]["spec"]["containers"][0]["command"])
    assert "--appendonly yes" in redis_command and "--maxmemory-policy noeviction" in redis_command

    workers = by_kind(docs, "StatefulSet", "gpu-worker")
    pod = workers["spec"]["template"]["spec"]
    (worker,) = pod["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 4
    env = {item["name"]: item for item in worker["env"]}
    assert env["H3BATCH_RANKS"]["value"] == "4"
    assert env["H3BATCH_WORKER_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    (rule,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert rule["topologyKey"] == "kubernetes.io/hostname"
    assert rule["labelSelector"]["matchLabels"] == workers["spec"]["template"]["metadata"]["labels"]
    assert pod["terminationGracePeriodSeconds"] > 60  # Celery's soft shutdown restores the unacked message
    mounts = {m["mountPath"] for m in worker["volumeMounts"]}
    assert {"/models", "/artifacts", "/dev/shm"} <= mounts
    assert by_kind(docs, "Service", workers["spec"]["serviceName"])["spec"]["clusterIP"] == "None"


def test_manifest_commands_resolve_in_the_code():
    """Each h3batch container's command + args, and its exec probes, resolve (see the module docstring)."""
    for doc, container in pod_containers(load_manifest()):
        if not OUR_IMAGES.search(container["image"]):
            continue
        where = f"{doc['kind']}/{doc['metadata']['name']}/{container['name']}"
        check_command(container.get("command", []) + container.get("args", []), where)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            if "exec" in container.get(probe, {}):
                check_command(container[probe]["exec"]["command"], f"{where} {probe}")


def test_manifest_variables_exist_in_the_code():
    """Each variable an h3batch container gets (env, ConfigMap, Secret) is read by the code, and literal H3BATCH_*
    values parse."""
    docs = load_manifest()
    for doc, container in pod_containers(docs):
        if not OUR_IMAGES.search(container["image"]):
            continue
        where = f"{doc['kind']}/{doc['metadata']['name']}/{container['name']}"
        env = container_env(container, docs, doc["metadata"]["namespace"])
        for name in env:
            check_variable(name, where)
        values = {k: v for k, v in env.items() if v is not None}
        if "@replace-with-" in values.get("H3BATCH_RELEASE", ""):  # the placeholder an operator fills with a commit
            values["H3BATCH_RELEASE"] = values["H3BATCH_RELEASE"].split("@")[0] + "@" + "ab" * 20
        check_settings_values(values, where)


MANIFEST_TARGETS = {"api": "api", "worker": "worker-cuda", "fetch-release": "worker-cuda"}
"""Manifest container name -> the docker/Dockerfile target its image must be."""


def test_manifest_images_and_commands_are_what_the_build_produces():
    """Each h3batch container's image is an image compose builds (by name, with the project's version as tag, or
    pinned by digest; never :latest), of the right target, and the long-running ones run that target's CMD."""
    built = built_images()
    assert set(built.values()) >= {"api", "loadrunner", "worker-cpu", "worker-cuda"}, built
    assert all(image.endswith(f":{project_version()}") for image in built), built
    seen = set()
    for doc, container in pod_containers(load_manifest()):
        if not OUR_IMAGES.search(container["image"]):
            continue
        where = f"{doc['kind']}/{doc['metadata']['name']}/{container['name']}"
        image = container["image"].rsplit("/", 1)[-1]
        name, digest = image.split("@", 1) if "@" in image else (image, None)
        if digest is not None:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{where}: {container['image']}"
            name = f"{name}:{project_version()}"
        assert not name.endswith(":latest") and ":" in name, f"{where}: {container['image']} is not pinned"
        assert name in built, f"{where}: {name} is not an image the build tags ({sorted(built)})"
        target = MANIFEST_TARGETS[container["name"]]
        assert built[name] == target, f"{where}: {name} is target {built[name]}, expected {target}"
        if container["name"] != "fetch-release":
            assert container["command"] + container.get("args", []) == stage_cmd(target), where
        seen.add(container["name"])
    assert seen == set(MANIFEST_TARGETS)


def test_the_release_is_named_once_for_init_and_worker():
    """The init container fetches exactly the release the worker serves: both read the ConfigMap's H3BATCH_RELEASE,
    a Hub repo with an explicit revision."""
    docs = load_manifest()
    release = by_kind(docs, "ConfigMap", "h3batch-config")["data"]["H3BATCH_RELEASE"]
    assert re.fullmatch(r"[\w.-]+/[\w.-]+@[\w.-]+", release), release
    pod = by_kind(docs, "StatefulSet", "gpu-worker")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["args"][0] == "$(H3BATCH_RELEASE)"
    for container in (init, *pod["containers"]):
        env = container_env(container, docs, "h3batch")
        assert env.get("H3BATCH_RELEASE") == release, container["name"]


def test_the_manifest_release_is_pinned_or_nothing_starts(tmp_path):
    """The ConfigMap asks for a pinned release (H3BATCH_REQUIRE_PINNED_RELEASE=1). As shipped, its revision is a
    placeholder, so the init container's `fetch-release` (a real child process, offline) exits 2 with one line naming
    the release, and the worker's settings refuse it naming H3BATCH_RELEASE, before anything is fetched. A branch is
    refused the same way; a 40-hex commit passes the check (and then misses only because this machine is offline)."""
    docs = load_manifest()
    data = by_kind(docs, "ConfigMap", "h3batch-config")["data"]
    assert data["H3BATCH_REQUIRE_PINNED_RELEASE"] == "1"
    repo = data["H3BATCH_RELEASE"].split("@")[0]
    env = {**os.environ, "H3BATCH_REQUIRE_PINNED_RELEASE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HUB_CACHE": str(tmp_path / "hf")}
    for release in (data["H3BATCH_RELEASE"], f"{repo}@main", repo):
        with pytest.raises(ConfigError, match=r"^H3BATCH_RELEASE: expected org/name@<40-hex Hub commit>"):
            Settings.from_env({"H3BATCH_RELEASE": release, "H3BATCH_REQUIRE_PINNED_RELEASE": "1"})
        done = subprocess.run([*H3BATCH, "fetch-release", release, "--hf-cache", str(tmp_path / "hf")], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done
        assert done.stderr.count("\n") == 1 and "40-hex Hub commit" in done.stderr, done.stderr
    pinned = f"{repo}@{'0123456789abcdef' * 2}01234567"
    assert Settings.from_env({"H3BATCH_RELEASE": pinned, "H3BATCH_REQUIRE_PINNED_RELEASE": "1"}).release_dir == pinned
    done = subprocess.run([*H3BATCH, "fetch-release", pinned, "--hf-cache", str(tmp_path / "hf")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "40-hex" not in done.stderr and "unavailable" in done.stderr, done.stderr


# --- docker-compose.yml -----------------------------------------------------------------------------------------


def compose_value(raw) -> str:
    """A compose value with ${VAR:-default} / ${VAR-default} replaced by the default and ${VAR:?...} / ${VAR} by a
    blank (unset) value."""
    text = str(raw)
    text = re.sub(r"\$\{[A-Z0-9_]+:?-([^}]*)\}", r"\1", text)
    return re.sub(r"\$\{[A-Z0-9_]+(:?\?[^}]*)?\}", "", text)


def our_compose_services() -> dict[str, dict]:
    return {name: service for name, service in load_compose().items()
            if "build" in service or OUR_IMAGES.search(service.get("image", ""))}


def test_compose_commands_resolve_in_the_code():
    """Each h3batch service's command (or its image's CMD, for those that keep it) and its probe resolve."""
    services = our_compose_services()
    assert {"api", "gpu-worker", "loadrunner", "beat", "flower", "flower-sweeps"} <= set(services)
    for name, service in services.items():
        command = service.get("command")
        if command is None:
            command = stage_cmd(service["build"]["target"])
        check_command([compose_value(part) for part in command], f"compose {name}")
        probe = service.get("healthcheck", {}).get("test", [])
        if probe[:1] == ["CMD"]:
            check_command(probe[1:], f"compose {name} healthcheck")


def test_compose_variables_exist_in_the_code():
    """Each variable an h3batch service gets is read by the code; literal and default H3BATCH_* values parse."""
    for name, service in our_compose_services().items():
        env = {key: compose_value(value) for key, value in (service.get("environment") or {}).items()}
        for var in env:
            check_variable(var, f"compose {name}")
        check_settings_values(env, f"compose {name}")


def test_the_checks_catch_what_they_should():
    """The helpers refuse an unknown subcommand, flag, celery command, variable and value."""
    with pytest.raises(AssertionError, match="not in h3batch/cli.py"):
        check_command(["h3batch", "gpu-worker"], "t")
    with pytest.raises(AssertionError, match="has no --gpus"):
        check_command(["h3batch", "worker", "--gpus", "4"], "t")
    with pytest.raises(AssertionError, match="celery has no command"):
        check_command(["celery", "--broker=redis://redis:6379/0", "flowers"], "t")
    with pytest.raises(AssertionError, match="flower has no option"):
        check_command(["celery", "--broker=redis://redis:6379/0", "flower", "--readonly"], "t")
    for name in ("H3BATCH_WORKERS_NAME", "AWS_SECRET_KEY", "HF_OFFLINE", "NCCL_DEBUGG"):
        with pytest.raises(AssertionError):
            check_variable(name, "t")
    with pytest.raises(pytest.fail.Exception, match="H3BATCH_RANKS"):
        check_settings_values({"H3BATCH_RANKS": "four"}, "t")


def test_deploy_doc_names_the_files_it_describes():
    """docs/deploy.md links the manifest, names both compose profiles and the store settings it tells one to set."""
    text = (REPO / "docs" / "deploy.md").read_text()
    assert "deploy/k8s/h3batch.yaml" in text and "--profile s3" in text and "--profile ops" in text
    for name in ("H3BATCH_ARTIFACT_STORE", "H3BATCH_S3_ENDPOINT_URL", "H3BATCH_ARTIFACT_REDIRECT", "H3BATCH_REDIS_URL",
                 "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert name in text, name
        check_variable(name, "docs/deploy.md")


@pytest.mark.parametrize("override", ["compose.cpu.yml", "compose.release.yml"])
def test_compose_overrides_resolve_in_the_code(override):
    """docker/compose.cpu.yml and docker/compose.release.yml only touch services of docker-compose.yml, and their
    commands and variables resolve like the main file's."""
    services = yaml.load((REPO / "docker" / override).read_text(), Loader=ResetLoader)["services"]
    assert set(services) <= set(load_compose()), override
    for name, service in services.items():
        if "command" in service:
            check_command([compose_value(part) for part in service["command"]], f"{override} {name}")
        env = {key: compose_value(value) for key, value in (service.get("environment") or {}).items()}
        for var in env:
            check_variable(var, f"{override} {name}")
        check_settings_values(env, f"{override} {name}")
