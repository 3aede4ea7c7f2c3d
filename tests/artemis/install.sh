#!/usr/bin/env bash
# Fetch the Apache ActiveMQ Artemis binary distribution once (Maven, from Maven Central into the
# local repository ~/.m2), unpack it into a cache folder outside the source tree, and print that
# folder (the broker's ARTEMIS_HOME). Needs Java 17+ (to run it) and Maven (to fetch it).
# SENDONCE_ARTEMIS_VERSION overrides the version; SENDONCE_ARTEMIS_CACHE the cache root.
set -euo pipefail
version="${SENDONCE_ARTEMIS_VERSION:-2.40.0}"
root="${SENDONCE_ARTEMIS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sendonce-artemis}"
target="$root/apache-artemis-$version"
if [ ! -x "$target/bin/artemis" ]; then
  rm -rf "$target"  # a half-written folder from an interrupted install
  mkdir -p "$root"
  work="$(mktemp -d "$root/.install.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  mvn -q -B -Dstyle.color=never dependency:copy \
    "-Dartifact=org.apache.activemq:apache-artemis:$version:tar.gz:bin" \
    "-DoutputDirectory=$work" >&2
  tar xzf "$work/apache-artemis-$version-bin.tar.gz" -C "$work"
  # Another install may have finished first: keep whichever landed.
  mv -T "$work/apache-artemis-$version" "$target" 2>/dev/null || true
fi
echo "$target"
