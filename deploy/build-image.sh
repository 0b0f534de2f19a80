#!/usr/bin/env bash
# Builds the container image with its version and revision labels filled in:
# VERSION from Cargo.toml, REVISION from git (with "-dirty" when the tracked
# files differ from the commit). Other arguments go to `docker build`:
#   deploy/build-image.sh -t REGISTRY/tcpx-rxdm:0.1.0 [--build-arg RUNTIME_IMAGE=...]
# DOCKER names the client (default: docker).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"$/\1/p;T;q' Cargo.toml)
[ -n "$version" ] || { echo "build-image: no version in Cargo.toml" >&2; exit 1; }
revision=
if revision=$(git rev-parse HEAD 2>/dev/null); then
  git diff --quiet HEAD -- 2>/dev/null || revision+=-dirty
else
  revision=
  echo "build-image: not a git checkout: the revision label stays empty" >&2
fi
exec "${DOCKER:-docker}" build --build-arg "VERSION=$version" --build-arg "REVISION=$revision" "$@" .
