#!/usr/bin/env bash
# One carry instead of two: install the SGLang 0.5.17 device wheels (.whl and .whl2, built by
# ../shared/devtools/sglang_device_wheels.sh) into a site folder here, for the device's Python 3.12,
# and pack that folder as one solid xz archive, .site/site.tar.xz.
#
# Why: the two wheel folders are 72 MiB together and a carry holds 64 MiB, so a fresh device machine
# needed two calls issued back to back, and a machine is released ~30 s after a call: sessions 24
# and 25 lost calls (and device time) to a second call that found a fresh machine. The wheels are
# zip files compressed one member at a time; the installed tree (~300 MiB) packed as one xz stream
# is ~40 MiB, which fits one carry.
#
# Use: bash scripts/device_site_pack.sh            (reads .whl and .whl2, writes .site/)
#      then carry [".site"] in any call: device_e2e.sh, device_plan.sh and device_kernels.sh unpack
#      it into /tmp/site once per machine (the folder installs are skipped when it is there).
# Env: SITE_PACK_LIMIT_MIB (default 60), SITE_PACK_XZ (xz flags, default -9e), PYTHON (the pip to use;
#      any Python with pip: the wheels are installed for cp312 / manylinux x86_64 by tags, not run).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
PY=${PYTHON:-python3}
LIMIT=${SITE_PACK_LIMIT_MIB:-60}
folders=()
for d in .whl .whl2; do
  if ls "$d"/*.whl >/dev/null 2>&1; then folders+=("$d"); fi
done
[ ${#folders[@]} -gt 0 ] || { echo "device_site_pack: no .whl/*.whl or .whl2/*.whl here" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
wheels=()
for d in "${folders[@]}"; do wheels+=("$d"/*.whl); done
plat=()
for p in manylinux_2_39_x86_64 manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_26_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_5_x86_64 manylinux1_x86_64 any; do plat+=(--platform "$p"); done
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$tmp/site" --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none "${plat[@]}" --only-binary=:all: "${wheels[@]}"
# Console scripts carry this machine's interpreter in their shebang; the device has its own.
if [ -d "$tmp/site/bin" ]; then
  for f in "$tmp/site/bin"/*; do
    [ -f "$f" ] && head -c 2 "$f" | grep -q '#!' && sed -i '1s|^#!.*python[0-9.]*$|#!/usr/bin/env python3|' "$f"
  done
fi
# What went in, for the device log and for `doctor`-style checks.
for w in "${wheels[@]}"; do
  printf '%s %s\n' "$(sha256sum "$w" | cut -d' ' -f1)" "$(basename "$w")"
done > "$tmp/site/.site_manifest"
mkdir -p .site
tar -C "$tmp/site" -cf - . | xz ${SITE_PACK_XZ:--9e} -T0 > "$tmp/site.tar.xz"
size=$(( ($(stat -c %s "$tmp/site.tar.xz") + 1048575) / 1048576 ))
if [ "$size" -gt "$LIMIT" ]; then
  echo "device_site_pack: the archive is $size MiB, over $LIMIT MiB (SITE_PACK_LIMIT_MIB): carry .whl and .whl2 instead" >&2
  exit 3
fi
mv "$tmp/site.tar.xz" .site/site.tar.xz
cp "$tmp/site/.site_manifest" .site/MANIFEST
echo "device_site_pack: .site/site.tar.xz $size MiB from ${#wheels[@]} wheels (${folders[*]}); carry [\".site\"]"
