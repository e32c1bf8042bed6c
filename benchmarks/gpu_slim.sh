#!/usr/bin/env bash
# Make ../shared/tools/gpu-bundle.sh's .gpu/ fit the device tool, and write .gpu/step.sh beside it.
#
#   ../shared/tools/gpu-bundle.sh && bash benchmarks/gpu_slim.sh      # once per machine (about 2 minutes)
#
# The bundle (51 MB) and the repository's own files (19 MB on 2026-12-07) pass the 64 MiB the device tool
# carries, so a call that carries the bundle as it comes is refused. Slimmed, it is 34 MB: drop the z3 command-line
# binary and keep one stripped libz3 (libz3.so a symlink); drop what is never read at run time: TileLang's and
# TVM's C++ sources (their headers stay), TileLang's Ascend and ROCm sources, cutlass's profiler and library tools,
# tvm_ffi's sources and libbacktrace, the wheels' RECORD files (libtvm_ffi_testing.so stays: tvm_ffi.core links
# it). Done once: a marker file in the archive says so.
#
# .gpu/step.sh, sourced by the call scripts under benchmarks/data/*/call.sh.txt, sources setup.sh and defines
# `step NAME TIMEOUT cmd...`: cmd under `timeout`, its output to $OUT/NAME.log, and a line "NAME rc=.. Ns HH:MM:SS"
# appended to $OUT/steps.txt, so that one step past its time cannot take the call's other results with it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu/site.tar.xz ] || { echo "no .gpu/site.tar.xz: run ../shared/tools/gpu-bundle.sh first" >&2; exit 1; }
if ! tar tJf .gpu/site.tar.xz | grep -q '\.slimmed2$'; then
  slim=$(mktemp -d)
  trap 'rm -rf "$slim"' EXIT
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
  tar cf - -C "$slim" . | xz -9 -T0 > .gpu/site.tar.xz.part
  mv .gpu/site.tar.xz.part .gpu/site.tar.xz
fi
cat > .gpu/step.sh <<'SH'
. .gpu/setup.sh
step() {
  local name=$1 t=$2; shift 2
  local t0=$(date +%s)
  timeout -k 10 "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s $(date -u +%H:%M:%S)" >> "$OUT/steps.txt"
  return $rc
}
SH
du -sh .gpu >&2
