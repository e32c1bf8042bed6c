#!/usr/bin/env bash
# Build .gpu/ray-site.tar.xz: ray (slimmed) and the dependencies the GPU machine lacks, for its Python 3.12,
# small enough to travel with .gpu/ (the carry limit is 64 MiB; ray's own wheel is 79 MB).
# On the GPU machine:  . .gpu/setup.sh && . .gpu/ray.sh   (ray.sh extracts it to /tmp/site-ray)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download "ray==${RAY_VERSION:-2.60.0}" protobuf msgpack jsonschema jsonschema-specifications referencing \
    rpds-py --python-version 3.12 --only-binary=:all: --no-deps --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$work/wheels" -q
mkdir "$work/site"
for w in "$work"/wheels/*.whl; do python3 -m zipfile -e "$w" "$work/site/"; done
cd "$work/site"
# what tuning never uses: Java, the dashboard's web client, the ML libraries
rm -rf ray/jars ray/dashboard/client ray/rllib ray/serve ray/data ray/tune ray/train ray/llm
find . -name "*.so" -exec strip --strip-unneeded {} \;
strip --strip-unneeded ray/core/src/ray/gcs/gcs_server ray/core/src/ray/raylet/raylet
chmod +x ray/core/src/ray/gcs/gcs_server ray/core/src/ray/raylet/raylet  # zipfile drops the mode bits
cd - > /dev/null
mkdir -p .gpu
tar cf - -C "$work/site" . | xz -9 -T0 > .gpu/ray-site.tar.xz
cat > .gpu/ray.sh <<'SH'
# source after setup.sh: ray (slimmed) for the GPU machine's Python 3.12
[ -d /tmp/site-ray/ray ] || { mkdir -p /tmp/site-ray && tar xJf .gpu/ray-site.tar.xz -C /tmp/site-ray; }
export PYTHONPATH=$PYTHONPATH:/tmp/site-ray
SH
ls -la .gpu/ray-site.tar.xz
# With TileLang's bundle the carry would pass 64 MiB: drop that bundle's z3 command-line binary and keep one
# stripped libz3 (libz3.so a symlink), 53 MB -> 37 MB; with the repository's own files (13 MB on 2026-11-29) that
# was still refused, so also drop what is never read at run time: TileLang's and TVM's C++ sources (their headers
# stay), TileLang's Ascend and ROCm sources, cutlass's profiler and library tools, tvm_ffi's sources and
# libbacktrace, the wheels' RECORD files: 37 MB -> 34 MB (libtvm_ffi_testing.so stays: tvm_ffi.core links it).
# Done once (the marker file says so).
if [ -f .gpu/site.tar.xz ] && ! tar tJf .gpu/site.tar.xz | grep -q '\.slimmed2$'; then
  slim=$(mktemp -d)
  tar xJf .gpu/site.tar.xz -C "$slim"
  rm -rf "$slim"/z3_solver-*.data/data/bin/z3
  if [ -f "$slim/z3/lib/libz3.so.4.15" ] && [ ! -L "$slim/z3/lib/libz3.so" ]; then
    strip --strip-unneeded "$slim/z3/lib/libz3.so.4.15"
    ln -sf libz3.so.4.15 "$slim/z3/lib/libz3.so"
  fi
  find "$slim/tilelang/3rdparty/tvm/src" "$slim/tilelang/src" -name "*.cc" -delete 2>/dev/null || true
  rm -rf "$slim/tilelang/src/ascend" "$slim/tilelang/src/rocm" "$slim/tilelang/3rdparty/cutlass/tools/profiler" \
    "$slim/tilelang/3rdparty/cutlass/tools/library" "$slim/tvm_ffi/src" "$slim/tvm_ffi/3rdparty/libbacktrace" \
    "$slim"/*.dist-info/RECORD
  touch "$slim/.slimmed" "$slim/.slimmed2"
  tar cf - -C "$slim" . | xz -9 -T0 > .gpu/site.tar.xz
  rm -rf "$slim"
  ls -la .gpu/site.tar.xz
fi
