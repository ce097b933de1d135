#!/usr/bin/env bash
# Build slimserve's CPU images with podman and smoke-check them (`make images`).
#
#   scripts/images.sh build      build the service and CPU Triton images (default: build then smoke)
#   scripts/images.sh smoke      checks inside the images; the cpu overlay's Deployments under podman kube play
#                                serve a tiny model repository and answer one Score
#   scripts/images.sh base       only make the local Debian base image (debootstrap), if missing
#
# Environment: BASE_IMAGE (default: a Debian bookworm base built here with debootstrap, for hosts that
# reach no registry; on a normal host use e.g. docker.io/library/debian:12.8-slim), TAG (image tag,
# default the package version), PIP_CA_BUNDLE (CA bundle pip inside the build should trust; default the
# host's, passed as a build secret), PODMAN (default podman).
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/scripts/podman/containers.conf}"
PODMAN="${PODMAN:-podman}"
LOCAL_BASE=localhost/debian-min:bookworm
BASE_IMAGE="${BASE_IMAGE:-$LOCAL_BASE}"
TAG="${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}"
SERVICE_IMAGE="localhost/slimserve-service:$TAG"
TRITON_IMAGE="localhost/slimserve-triton-cpu:$TAG"
PIP_CA_BUNDLE="${PIP_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
PY="${PY:-.venv/bin/python}"

log() { echo "images: $*" >&2; }

make_base() {
  if "$PODMAN" image exists "$BASE_IMAGE"; then return; fi
  if [[ "$BASE_IMAGE" != "$LOCAL_BASE" ]]; then
    log "base image $BASE_IMAGE is missing: pull it first (builds run with --pull=never)"
    exit 1
  fi
  log "making $LOCAL_BASE with debootstrap (a few minutes)"
  local rootfs status=0
  rootfs="$(mktemp -d)"
  {
    debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >/dev/null &&
      rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* &&
      tar -C "$rootfs" -c . | "$PODMAN" import - "$LOCAL_BASE" >/dev/null
  } || status=$?
  rm -rf "$rootfs"
  return "$status"
}

build_one() {  # build_one IMAGE CONTAINERFILE
  local secret=()
  [[ -f "$PIP_CA_BUNDLE" ]] && secret=(--secret "id=pip-ca,src=$PIP_CA_BUNDLE")
  log "building $1 from $2 on $BASE_IMAGE"
  "$PODMAN" build --pull=never --network=host --layers "${secret[@]}" \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" -f "$2" -t "$1" .
}

build() {
  make_base
  build_one "$SERVICE_IMAGE" services/Containerfile
  build_one "$TRITON_IMAGE" services/triton-cpu/Containerfile
  "$PODMAN" images --filter reference='localhost/slimserve-*' >&2
}

smoke() {  # inside the images, then the cpu overlay under `podman kube play`: one Score through the pods
  SLIMSERVE_REQUIRE_IMAGES=1 "$PY" -m pytest -q -m podman tests/test_images.py tests/test_k8s.py
}

case "${1:-all}" in
  base) scripts/podman-setup.sh >/dev/null && make_base ;;
  build) scripts/podman-setup.sh >/dev/null && build ;;
  smoke) smoke ;;
  all) scripts/podman-setup.sh >/dev/null && build && smoke ;;
  *) echo "usage: $0 [all|build|smoke|base]" >&2; exit 2 ;;
esac
