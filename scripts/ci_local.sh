#!/usr/bin/env bash
# Runs `.ci/run` as CI does: on a fresh clone of this checkout's HEAD, CPU only. The clone (about
# 9 GB with its venv) is deleted when the run ends, pass or fail, so that repeated runs do not fill
# the disk that later CI runs need; the log stays.
#
#   bash scripts/ci_local.sh            # log: /tmp/ci_<short sha>.log, exit status: .ci/run's
#   CI_KEEP=1 bash scripts/ci_local.sh  # keep the clone (its .ci-venv serves local test runs)
#   CI_DIR, CI_LOG: where the clone and the log go
set -uo pipefail
src=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel) || exit 2
sha=$(git -C "$src" rev-parse --short HEAD) || exit 2
dir=${CI_DIR:-/tmp/ci_$sha}
log=${CI_LOG:-/tmp/ci_$sha.log}
rm -rf "$dir"
git clone -q "$src" "$dir" || exit 2
if [ "${CI_KEEP:-0}" != 1 ]; then
  trap 'rm -rf "$dir"' EXIT
fi
start=$(date +%s)
(cd "$dir" && bash .ci/run) >"$log" 2>&1
rc=$?
echo "ci_local: $sha rc=$rc in $(( $(date +%s) - start )) s; $(tail -n 1 "$log")" | tee -a "$log"
exit $rc
