#!/usr/bin/env bash
# Build the library that paces noida-db's saves (deploy/noida/save_pacing.c) into .tools/lib/,
# with the system's C compiler. `gpulens up` preloads it into the embedded broker where it is
# found (gpulens/infra/broker.py); without it the broker saves at its own pace. Prints its path.
set -euo pipefail
cd "$(dirname "$0")/../.."
lib="$PWD/.tools/lib/libnoida_save_pacing.so"
src="deploy/noida/save_pacing.c"
compiler="$(command -v cc || command -v gcc)" || { echo "no C compiler (cc, gcc) on PATH" >&2; exit 1; }
mkdir -p "$(dirname "$lib")"
"$compiler" -O2 -Wall -Wextra -Werror -shared -fPIC -o "$lib.tmp" "$src" -ldl
mv "$lib.tmp" "$lib"
echo "$lib"
