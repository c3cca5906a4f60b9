#!/usr/bin/env bash
# Makes a Python base image for deploy/Dockerfile from Debian's packages alone, for machines
# that reach Debian's archive and PyPI but no container registry (where
# python:3.11-slim-bookworm cannot be pulled):
#
#   deploy/base/build-base.sh                  # prints the tag it made or found
#   DOCKER_BUILDKIT=1 docker build --build-arg PYTHON_IMAGE="$(deploy/base/build-base.sh)" \
#     -f deploy/Dockerfile .   # + --secret id=pip-ca-bundle,... behind a TLS proxy (see there)
#
# debootstrap --variant=minbase bookworm + python3 (3.11), pip, venv and the CA certificates,
# imported with `docker import`. Like the public python image it lets pip install into the
# interpreter (no EXTERNALLY-MANAGED marker: the image is the environment) and has `python`.
# The tag carries a hash of this script, so an edited script makes a new base (and removes the
# older ones) and an unchanged one is reused from the engine's image store (pass --rebuild to
# make it anew, with Debian's updates since).
#
# Environment: DOCKER (the engine's client, default `docker`), DEBIAN_MIRROR (default: the
# first Debian URI in /etc/apt/sources.list.d/debian.sources, else deb.debian.org),
# INFERWAY_BASE_REPO (image name, default inferway-base). Needs root (debootstrap) and
# debootstrap itself (apt-get install debootstrap).
set -euo pipefail

rebuild=0
[[ "${1:-}" == "--rebuild" ]] && rebuild=1

docker_cli="${DOCKER:-docker}"
suite=bookworm
packages=python3,python3-pip,python3-venv,python-is-python3,ca-certificates
script_hash=$(sha256sum "$0" | cut -c1-12)
tag="${INFERWAY_BASE_REPO:-inferway-base}:${suite}-${script_hash}"

if [[ $rebuild == 0 ]] && "$docker_cli" image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag"
  exit 0
fi

if [[ -z "${DEBIAN_MIRROR:-}" ]]; then
  DEBIAN_MIRROR=$(awk '/^URIs:/ && $2 ~ /\/debian\/?$/ {print $2; exit}' \
    /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
fi
command -v debootstrap >/dev/null || {
  echo "build-base.sh: debootstrap is missing (apt-get install debootstrap)" >&2
  exit 1
}

rootfs=$(mktemp -d /var/tmp/inferway-base.XXXXXX)
cleanup() {
  # debootstrap unmounts what it mounted (proc, sys) unless it was interrupted
  awk -v root="$rootfs/" 'index($2, root) == 1 {print $2}' /proc/mounts | sort -r \
    | xargs -r umount -l
  rm -rf --one-file-system "$rootfs" "$rootfs.log"
}
trap cleanup EXIT
started=$SECONDS
if ! debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$DEBIAN_MIRROR" \
    >"$rootfs.log" 2>&1; then
  echo "build-base.sh: debootstrap $suite from $DEBIAN_MIRROR failed; its log:" >&2
  tail -30 "$rootfs.log" >&2
  exit 1
fi

# what an image does not need: apt's downloaded lists and packages, docs, man pages, locales
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/cache/debconf/*-old \
  "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
  "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
find "$rootfs"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} +
find "$rootfs"/usr/lib/python3* -name __pycache__ -prune -exec rm -rf {} +
rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
# apt's sources as the public Debian images have them: the image knows no local mirror
printf 'deb http://deb.debian.org/debian %s main\n' "$suite" >"$rootfs/etc/apt/sources.list"
: >"$rootfs/etc/resolv.conf"
: >"$rootfs/etc/hostname"

tar --numeric-owner -C "$rootfs" -c . | "$docker_cli" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  --message "debootstrap --variant=minbase $suite + $packages (deploy/base/build-base.sh)" \
  - "$tag" >/dev/null
echo "build-base.sh: made $tag in $((SECONDS - started)) s" >&2
# bases made by earlier versions of this script: nothing builds on them any more
"$docker_cli" image ls --format '{{.Repository}}:{{.Tag}}' "${tag%%:*}" | grep -vxF "$tag" \
  | xargs -r "$docker_cli" rmi >/dev/null 2>&1 || true
echo "$tag"
