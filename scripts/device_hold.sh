#!/usr/bin/env bash
# Keep a device call's copy of the working tree under the run tool's 64 MiB: the measured data in
# docs/data (25 MB by session 44) plus .site (40 MB) no longer fit together, and a device call never
# reads docs/data. This moves docs/data out of the tree before device calls and back after.
#
#   bash scripts/device_hold.sh size       # MiB a call would copy (tracked + untracked, not ignored) + .site
#   bash scripts/device_hold.sh hold       # docs/data -> $HOLD (default ../.device_hold/docs_data)
#   bash scripts/device_hold.sh restore    # back into the tree (run it before any commit)
#
# `git status` shows docs/data deleted while it is held; `restore` refuses to overwrite a docs/data
# that came back some other way.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
HOLD=${HOLD:-$REPO/../.device_hold/docs_data}
size() {
  local files=$(
    { git ls-files -z; git ls-files -z -o --exclude-standard; } | xargs -0 -r du -cb 2>/dev/null | awk '/\ttotal$/{s+=$1} END{print s+0}')
  local site=$(du -sb .site 2>/dev/null | cut -f1)
  local total=$(( (files + ${site:-0}) / 1048576 ))
  echo "tree $(( files / 1048576 )) MiB + .site $(( ${site:-0} / 1048576 )) MiB = $total MiB (limit 64)"
  # the run tool counted more than this sum in session 44: it refused a call at 63 MiB by this count
  if [ "$total" -ge 56 ]; then echo "device_hold: near the limit; hold docs/data before device calls"; fi
}
case "${1:-size}" in
  size) size ;;
  hold)
    [ -d docs/data ] || { echo "device_hold: no docs/data here (held already? $HOLD)" >&2; exit 2; }
    [ -e "$HOLD" ] && { echo "device_hold: $HOLD exists; restore or remove it first" >&2; exit 2; }
    mkdir -p "$(dirname "$HOLD")"
    mv docs/data "$HOLD"
    echo "device_hold: docs/data held at $HOLD"; size ;;
  restore)
    [ -d "$HOLD" ] || { echo "device_hold: nothing held at $HOLD" >&2; exit 2; }
    [ -e docs/data ] && { echo "device_hold: docs/data exists in the tree; merge $HOLD by hand" >&2; exit 2; }
    mv "$HOLD" docs/data
    echo "device_hold: docs/data restored"; size ;;
  *) echo "usage: $0 size|hold|restore" >&2; exit 2 ;;
esac
