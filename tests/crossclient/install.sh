#!/usr/bin/env bash
# Install the cross-client suite's node packages (npm ci, from the committed lockfile) into a
# cache folder outside the source tree, once per lockfile, and print that folder's node_modules.
# SENDONCE_CROSSCLIENT_CACHE overrides the cache root.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
digest="$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -c1-16)"
root="${SENDONCE_CROSSCLIENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sendonce-crossclient}"
target="$root/$digest"
if [ ! -f "$target/installed" ]; then
  rm -rf "$target"  # a half-written folder from an interrupted install
  mkdir -p "$root"
  work="$(mktemp -d "$root/.install.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  cp "$here/package.json" "$here/package-lock.json" "$work/"
  (cd "$work" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  touch "$work/installed"
  # Another install may have finished first: keep whichever landed.
  mv -T "$work" "$target" 2>/dev/null || true
fi
echo "$target/node_modules"
