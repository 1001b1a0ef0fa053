#!/usr/bin/env bash
# A Python 3.11 base image made from Debian bookworm's packages, for machines that reach a Debian mirror but no image
# registry (docs/deploy.md "Offline"). Debian bookworm's python3 is 3.11; the image also holds redis-server and
# redis-cli, so it serves compose's `redis` too (H3BATCH_REDIS_IMAGE).
#
#   docker/base-image.sh [IMAGE]        default localhost/h3batch-base:bookworm; ENGINE=docker|podman (podman)
#
# Kept when IMAGE already exists. Needs mmdebstrap (Debian package) and root.
set -euo pipefail
IMAGE=${1:-localhost/h3batch-base:bookworm}
ENGINE=${ENGINE:-podman}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if "$ENGINE" image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "base image $IMAGE already present"
  exit 0
fi
command -v mmdebstrap >/dev/null || { echo "base-image.sh: mmdebstrap not found (apt-get install mmdebstrap)" >&2; exit 2; }
tar=$(mktemp --suffix=.tar)
trap 'rm -f "$tar"' EXIT
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates,redis-server \
  bookworm "$tar" "$MIRROR"
"$ENGINE" import --change 'CMD ["/bin/bash"]' "$tar" "$IMAGE" >/dev/null
echo "base image $IMAGE built from Debian bookworm ($MIRROR)"
