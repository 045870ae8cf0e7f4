#!/usr/bin/env bash
# Install promtool into .tools/ from Debian's `prometheus` package, without installing the
# package (no service, no user, no systemd unit): download the .deb, unpack it, keep promtool.
# Idempotent: does nothing when .tools/bin/promtool already runs. Prints promtool's path.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools="$PWD/.tools"
promtool="$tools/bin/promtool"
if [ -x "$promtool" ] && "$promtool" --version >/dev/null 2>&1; then
  echo "$promtool"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# apt-get download needs the package lists; refresh them only when it cannot find the package.
(cd "$work" && apt-get download -qq prometheus 2>/dev/null) \
  || (apt-get update -qq && cd "$work" && apt-get download -qq prometheus)
dpkg -x "$work"/prometheus_*.deb "$work/root"
mkdir -p "$tools/bin"
install -m 0755 "$work/root/usr/bin/promtool" "$promtool"
"$promtool" --version >/dev/null
echo "$promtool"
