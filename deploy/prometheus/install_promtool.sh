#!/usr/bin/env bash
# Install promtool into .tools/ from Debian's `prometheus` package, without installing the
# package (no service, no user, no systemd unit). Idempotent: does nothing when
# .tools/bin/promtool already runs. Prints promtool's path.
set -euo pipefail
cd "$(dirname "$0")/../.."
promtool="$PWD/.tools/bin/promtool"
if ! { [ -x "$promtool" ] && "$promtool" --version >/dev/null 2>&1; }; then
  deploy/unpack_from_debian.sh prometheus usr/bin/promtool "$promtool" 0755
  "$promtool" --version >/dev/null
fi
echo "$promtool"
