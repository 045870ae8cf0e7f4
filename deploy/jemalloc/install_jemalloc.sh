#!/usr/bin/env bash
# Install jemalloc's shared library into .tools/lib/ from Debian's `libjemalloc2` package, without
# installing the package. `gpulens up` runs the worker, the sink and the exporter on it where it
# is found (gpulens/infra/python_allocator.py). Idempotent: does nothing when the library is
# there. Prints its path.
set -euo pipefail
cd "$(dirname "$0")/../.."
lib="$PWD/.tools/lib/libjemalloc.so.2"
[ -f "$lib" ] || deploy/unpack_from_debian.sh libjemalloc2 'usr/lib/*/libjemalloc.so.2' "$lib" 0644
echo "$lib"
