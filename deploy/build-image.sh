#!/usr/bin/env bash
# Build brim's container image with podman where no image registry is reachable: the base is a
# minimal Debian (python3 and its venv module) made with debootstrap from Debian's own package
# mirror and imported into podman, and pip reaches the package index as this machine does (its
# CA bundle and pip configuration are mounted read-only into the build, never copied into it).
#
#   sudo deploy/build-image.sh        # → brim:<version> (podman: localhost/brim:<version>)
#
# Where a registry is reachable, `docker build -t brim:<version> .` (or podman build) from the
# repository root builds the same image on the official python:3.11-slim instead.
#
# Environment:
#   BRIM_IMAGE      the tag to build (default: brim:<the version in pyproject.toml>)
#   DEBIAN_SUITE    the base's Debian release (default: bookworm)
#   DEBIAN_MIRROR   where debootstrap downloads it (default: http://deb.debian.org/debian)
# The base is made once per machine and kept as localhost/brim-base:<suite>: remove that image
# (podman rmi) to make it afresh, with Debian's latest security updates.
# Needs root (debootstrap, and podman's chroot isolation), podman and debootstrap.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
tag="${BRIM_IMAGE:-brim:$version}"
suite="${DEBIAN_SUITE:-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
base="localhost/brim-base:$suite"

say() { echo "build-image: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  say "run me as root (debootstrap and podman's chroot isolation need it)"
  exit 1
fi
for tool in podman debootstrap; do
  command -v "$tool" >/dev/null 2>&1 || { say "$tool is not installed (apt-get install $tool)"; exit 1; }
done

started=$SECONDS
if podman image exists "$base"; then
  say "base $base: kept from an earlier run"
else
  say "base $base: debootstrap $suite from $mirror"
  rootfs=$(mktemp -d "${TMPDIR:-/var/tmp}/brim-base.XXXXXX")
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || { tail -20 "$rootfs.log" >&2; exit 1; }
  rm -f "$rootfs.log"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --quiet - "$base" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
  say "base $base: made in $((SECONDS - started)) s"
fi

# What pip reads on this machine, mounted where it reads it.
mounts=()
for path in /etc/ssl/certs/ca-certificates.crt /etc/pip.conf /etc/xdg/pip "$HOME/.config/pip" "$HOME/.pip"; do
  [ -e "$path" ] && mounts+=(--volume "$path:$path:ro")
done

build_started=$SECONDS
podman build --isolation chroot --network host --format docker \
  --build-arg "BASE=$base" "${mounts[@]}" --tag "$tag" . >&2
say "built $tag in $((SECONDS - build_started)) s ($((SECONDS - started)) s in all)"
echo "$tag"
