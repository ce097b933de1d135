#!/usr/bin/env bash
# Install podman (and what building a local base image needs) from Debian's packages, once.
# Called by `make images`; idempotent. Needs root (apt-get).
set -euo pipefail
PACKAGES=(podman buildah runc debootstrap uidmap slirp4netns fuse-overlayfs containernetworking-plugins
  golang-github-containers-common catatonit conmon iptables)
missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "podman-setup: need root to install ${missing[*]} (or install them yourself)" >&2
    exit 1
  fi
  echo "podman-setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
podman --version
