#!/usr/bin/env bash
# Unpack one file of a Debian package without installing the package (no service, no user, no
# maintainer scripts): download the .deb, unpack it, keep that file.
#   deploy/unpack_from_debian.sh PACKAGE MEMBER DEST MODE
# MEMBER: the file's path inside the package, a glob allowed (usr/lib/*/libjemalloc.so.2).
set -euo pipefail
package="$1" member="$2" dest="$3" mode="$4"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# apt-get download needs the package lists; refresh them only when it cannot find the package.
(cd "$work" && apt-get download -qq "$package" 2>/dev/null) \
  || (apt-get update -qq && cd "$work" && apt-get download -qq "$package")
dpkg -x "$work/${package}"_*.deb "$work/root"
# shellcheck disable=SC2086  # the member's glob expands here
set -- "$work"/root/$member
[ -e "$1" ] || { echo "$package has no $member" >&2; exit 1; }
mkdir -p "$(dirname "$dest")"
install -m "$mode" "$1" "$dest"
