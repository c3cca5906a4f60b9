#!/usr/bin/env bash
# Installs what builds and runs deploy/Dockerfile on a Debian machine that reaches Debian's
# archive and PyPI but no container registry: Debian's docker.io (dockerd 20.10 with BuildKit
# built in, its own client /usr/bin/docker, containerd, runc) and debootstrap (for
# deploy/base/build-base.sh). Does nothing when both are there; starts no daemon (the image
# tests start dockerd when it is not running). Needs root. tests/image runs it when needed.
set -euo pipefail
if [[ -x /usr/sbin/dockerd && -x /usr/bin/docker ]] && command -v debootstrap >/dev/null; then
  exit 0
fi
log=${INFERWAY_APT_LOG:-/tmp/inferway-engine-apt.log}
if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends docker.io debootstrap) >"$log" 2>&1; then
  echo "ci-engine.sh: apt-get install docker.io debootstrap failed; its output:" >&2
  tail -30 "$log" >&2
  exit 1
fi
echo "ci-engine.sh: installed $(/usr/sbin/dockerd --version) and debootstrap"
