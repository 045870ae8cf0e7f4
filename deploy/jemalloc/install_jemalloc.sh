#!/usr/bin/env bash
# Install jemalloc's shared library into .tools/lib/ from Debian's `libjemalloc2` package, without
# installing the package: download the .deb, unpack it, keep the library. `gpulens up` runs the
# worker, the sink and the exporter on it where it is found (gpulens/infra/python_allocator.py).
# Idempotent: does nothing when the library is there. Prints its path.
set -euo pipefail
cd "$(dirname "$0")/../.."
lib="$PWD/.tools/lib/libjemalloc.so.2"
if [ -f "$lib" ]; then
  echo "$lib"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# apt-get download needs the package lists; refresh them only when it cannot find the package.
(cd "$work" && apt-get download -qq libjemalloc2 2>/dev/null) \
  || (apt-get update -qq && cd "$work" && apt-get download -qq libjemalloc2)
dpkg -x "$work"/libjemalloc2_*.deb "$work/root"
mkdir -p "$(dirname "$lib")"
install -m 0644 "$(find "$work/root" -name 'libjemalloc.so.2' | head -1)" "$lib"
echo "$lib"
