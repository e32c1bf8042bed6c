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
# With TileLang's bundle the carry would pass 64 MiB: slim that bundle too (once; benchmarks/gpu_slim.sh says how).
bash benchmarks/gpu_slim.sh
