#!/usr/bin/env bash
# Installs the Debian packages of scripts/test-deps.txt whose binary is missing, so that
# `make test` runs what CI runs. Everything present: says so and exits at once (no apt-get).
# Cannot install (not root, no apt-get, apt-get failed): says what is missing and why, and
# exits 0 so the suite still runs (those tests skip, saying so); in CI (CI=true, or --strict)
# it exits 1 instead, because there a missing component fails its tests anyway.
set -euo pipefail
list="$(cd "$(dirname "$0")" && pwd)/test-deps.txt"

strict=0
case "${CI:-}" in 1 | [Tt]rue | TRUE | yes) strict=1 ;; esac
for arg in "$@"; do
  case "$arg" in
    --strict) strict=1 ;;
    *) echo "usage: $0 [--strict]" >&2; exit 2 ;;
  esac
done

missing=() packages=()
while read -r binary package _; do
  [[ -z "${binary}" || "${binary}" == \#* ]] && continue
  if ! command -v "${binary}" >/dev/null 2>&1; then
    missing+=("${binary}")
    [[ " ${packages[*]} " == *" ${package} "* ]] || packages+=("${package}")
  fi
done <"${list}"

if ((${#missing[@]} == 0)); then
  echo "test dependencies: all present ($(grep -v '^#' "${list}" | awk 'NF {print $1}' | paste -sd' '))"
  exit 0
fi

give_up() {
  echo "test dependencies: missing ${missing[*]} (Debian ${packages[*]}), not installed: $1"
  if ((strict)); then
    echo "test dependencies: CI needs every one of them (scripts/test-deps.txt)"
    exit 1
  fi
  echo "test dependencies: their tests skip, saying so"
  exit 0
}

if [[ "$(id -u)" != 0 ]]; then
  give_up "not root: as root, or with sudo, apt-get install ${packages[*]}"
fi
if ! command -v apt-get >/dev/null 2>&1; then
  give_up "no apt-get here: install ${missing[*]} another way"
fi

log="$(mktemp "${TMPDIR:-/tmp}/inferway-test-deps.XXXXXX.log")"
echo "test dependencies: installing ${packages[*]} (apt-get; log ${log})"
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  --no-install-recommends "${packages[@]}"; } >"${log}" 2>&1; then
  tail -n 20 "${log}" | sed 's/^/  apt-get: /'
  give_up "apt-get failed, see ${log}"
fi
still=()
for binary in "${missing[@]}"; do
  command -v "${binary}" >/dev/null 2>&1 || still+=("${binary}")
done
if ((${#still[@]})); then
  missing=("${still[@]}")
  give_up "installed, but still not on PATH"
fi
echo "test dependencies: installed ${packages[*]}"
