#!/usr/bin/env bash
# Fetch the Apache ActiveMQ Artemis binary distribution once (Maven, from Maven Central into the
# local repository ~/.m2), unpack it into a cache folder outside the source tree, and print that
# folder (the broker's ARTEMIS_HOME). Needs Java 17+ (to run it) and Maven (to fetch it).
# SENDONCE_ARTEMIS_VERSION overrides the version; SENDONCE_ARTEMIS_CACHE the cache root.
#
# Any failure stops the script with a message on stderr and a non-zero status; the path is
# printed only when the distribution is there. The Maven plugin is pinned (an unpinned one
# resolves to whatever the local repository or the Maven version prefers: 2.8, from 2013) and
# checksums are strict (a corrupt or tampered download fails instead of a warning).
set -euo pipefail
version="${SENDONCE_ARTEMIS_VERSION:-2.40.0}"
root="${SENDONCE_ARTEMIS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sendonce-artemis}"
target="$root/apache-artemis-$version"
plugin="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

fail() {
  echo "install.sh: $*" >&2
  exit 1
}

# Java first: the broker needs 17 or later (as bin/artemis does: JAVA_HOME, else java on PATH).
java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
command -v "$java" >/dev/null 2>&1 \
  || fail "Java 17 or later is needed to run the Artemis broker, and '$java' was not found: install a JDK 17+ (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
said="$("$java" -version 2>&1 || true)"
release="$(printf '%s\n' "$said" | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1)"
case "$release" in
  1.*) major="$(printf '%s' "$release" | cut -d. -f2)" ;;  # 1.8.0_392 is Java 8
  *) major="${release%%[.+-]*}" ;;
esac
case "$major" in
  '' | *[!0-9]*) fail "cannot tell the version of '$java' (it said: $(printf '%s' "$said" | head -n 1)); the Artemis broker needs Java 17 or later" ;;
esac
[ "$major" -ge 17 ] \
  || fail "the Artemis broker needs Java 17 or later, and '$java' is Java $major ($release): install a JDK 17+ or set JAVA_HOME to one"

if [ ! -x "$target/bin/artemis" ]; then
  command -v mvn >/dev/null 2>&1 \
    || fail "Maven (mvn) is needed once to fetch Artemis $version: apt-get install maven (or brew install maven)"
  rm -rf "$target"  # a half-written folder from an interrupted install
  mkdir -p "$root"
  work="$(mktemp -d "$root/.install.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  mvn -q -B -C -Dstyle.color=never "$plugin:copy" \
    "-Dartifact=org.apache.activemq:apache-artemis:$version:tar.gz:bin" \
    "-DoutputDirectory=$work" >&2 \
    || fail "Maven could not fetch org.apache.activemq:apache-artemis:$version (see above)"
  archive="$work/apache-artemis-$version-bin.tar.gz"
  [ -s "$archive" ] || fail "Maven reported success but $archive is missing or empty"
  tar xzf "$archive" -C "$work" || fail "cannot unpack $archive"
  [ -x "$work/apache-artemis-$version/bin/artemis" ] \
    || fail "$archive holds no apache-artemis-$version/bin/artemis"
  # Another install may have finished first: its folder is as good as ours. Any other
  # failure of the move is one.
  if ! mv -T "$work/apache-artemis-$version" "$target" 2>"$work/mv.err"; then
    [ -x "$target/bin/artemis" ] \
      || fail "cannot move the distribution to $target: $(cat "$work/mv.err")"
  fi
fi
[ -x "$target/bin/artemis" ] || fail "$target/bin/artemis is missing after the install"
echo "$target"
