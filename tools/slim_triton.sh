#!/usr/bin/env bash
# A Triton release small enough to travel to the device machine (which has no internet and takes 64 MiB of
# carried files): the wheel for the device's Python, less the CUDA tools it bundles (the machine's own toolkit
# stands in: tools/h200_check.sh points Triton at it), CUPTI, proton and the test plugins, with libtriton
# stripped: about 38 MB as .tar.xz for 3.7.1.
# Usage: bash tools/slim_triton.sh [VERSION] [PYTHON_TAG]   (default 3.7.1 312) -> .whl/triton-VERSION-cpTAG-slim.tar.xz
set -euo pipefail
VERSION=${1:-3.7.1}
TAG=${2:-312}
OUT_DIR=${OUT_DIR:-.whl}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$TAG" -d "$work" \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 "triton==$VERSION"
mkdir -p "$work/site" "$OUT_DIR"
(cd "$work/site" && python3 -m zipfile -e "$work"/triton-*.whl .)
t="$work/site/triton"
rm -rf "$t/backends/nvidia/bin" "$t/backends/nvidia/lib/cupti" "$t/instrumentation" "$t/plugins" "$t/profiler" \
  "$t/FileCheck" "$t/_C/libproton.so"
strip --strip-unneeded "$t/_C/libtriton.so" 2>/dev/null || true
out="$OUT_DIR/triton-$VERSION-cp$TAG-slim.tar.xz"
tar cJf "$out" -C "$work" site
ls -l "$out"
