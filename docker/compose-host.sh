#!/usr/bin/env bash
# Prepares this machine to build and run docker-compose.yml (`make test-compose`, docs/deploy.md):
#   - an engine: Docker with Compose >= 2.24.4 when present, else podman from the distribution's packages with
#     podman-compose (pinned, from PyPI) in .venv-compose;
#   - podman's settings for machines like the dev/CI one (runc, cgroupfs, no default ulimits, host netns by default),
#     in var/compose/containers.conf, used through CONTAINERS_CONF (the host's /etc/containers is left alone);
#   - the base images: the public ones when a registry answers, else docker/base-image.sh's local Debian image;
#   - docker/wheels/ (the lock's CPU torch from pip's find-links, when there) and docker/certs/ (this host's local CAs).
# Writes var/compose/env (KEY=VALUE lines the test reads) and prints it. COMPOSE builds one image at a time
# (--parallel 1): the targets share their first stages, and the dev machine has 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PODMAN_COMPOSE_VERSION=1.6.0
OUT=var/compose
mkdir -p "$OUT"
env_file=$OUT/env
: > "$env_file"

if command -v docker >/dev/null && docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
  engine=docker
  compose="docker compose --parallel 1"
else
  engine=podman
  if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null || ! command -v runc >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap >/dev/null
  fi
  cat > "$OUT/containers.conf" <<'EOF'
# Written by docker/compose-host.sh: crun fails on this machine kind's cgroup setup and setrlimit; runc with cgroupfs
# and no default ulimits works. Compose's services get their own network; a bare `podman run` gets the host's.
[containers]
default_ulimits = []
netns = "host"

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
EOF
  echo "CONTAINERS_CONF=$PWD/$OUT/containers.conf" >> "$env_file"
  export CONTAINERS_CONF=$PWD/$OUT/containers.conf
  if [ ! -x .venv-compose/bin/podman-compose ]; then
    python3 -m venv .venv-compose
    .venv-compose/bin/python -m pip install -q --disable-pip-version-check "podman-compose==$PODMAN_COMPOSE_VERSION"
  fi
  compose="$PWD/.venv-compose/bin/podman-compose --parallel 1"
fi
echo "ENGINE=$engine" >> "$env_file"
echo "COMPOSE=$compose" >> "$env_file"

# A registry that answers within a minute serves the public bases; otherwise build them from Debian's packages.
if timeout 60 "$engine" pull -q docker.io/library/python:3.11-slim >/dev/null 2>&1 \
   && timeout 60 "$engine" pull -q docker.io/library/redis:7.4-alpine >/dev/null 2>&1; then
  echo "H3BATCH_BASE_IMAGE=python:3.11-slim" >> "$env_file"
else
  ENGINE=$engine docker/base-image.sh localhost/h3batch-base:bookworm
  echo "H3BATCH_BASE_IMAGE=localhost/h3batch-base:bookworm" >> "$env_file"
  echo "H3BATCH_REDIS_IMAGE=localhost/h3batch-base:bookworm" >> "$env_file"
fi

# The lock's CPU torch from pip's local wheel folder, when this machine has one: then no torch index is needed.
torch_pin=$(grep -m1 -o '^torch==[^ ]*' docker/requirements/worker-cpu.txt | cut -d= -f3)
wheel=""
for dir in ${PIP_FIND_LINKS:-} /opt/wheels; do
  [ -d "$dir" ] && wheel=$(ls "$dir"/torch-"$torch_pin"-*.whl 2>/dev/null | head -1) && [ -n "$wheel" ] && break
done
if [ -n "$wheel" ]; then
  cp -u "$wheel" docker/wheels/
  echo "H3BATCH_TORCH_INDEX_URL=" >> "$env_file"
fi
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  cp -u /usr/local/share/ca-certificates/*.crt docker/certs/
fi
cat "$env_file"
