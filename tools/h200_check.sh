#!/usr/bin/env bash
# One whole GPU check for the device machine (the H200): environment, GPU tests, then the quick
# benchmark, with logs under $OUT (or ./gpu-out). Usage: bash tools/h200_check.sh [pytest args...]
# (with pytest-xdist and execnet wheels in .whl/, `-n 6` spreads the tests over six workers on the one GPU).
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/generated${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Optional peers: fla-core (and einops where the machine lacks it) travel as wheels in .whl/ (not committed).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
# Optional: another Triton release in place of the machine's, from tools/slim_triton.sh (.whl/triton-*-slim.tar.xz,
# one at most), run on the machine's CUDA toolkit (its ptxas, cuobjdump and nvdisasm; the slim build has none).
if ls .whl/triton-*-slim.tar.xz >/dev/null 2>&1; then
  mkdir -p /tmp/triton-slim && tar xJf "$(ls .whl/triton-*-slim.tar.xz | head -n 1)" -C /tmp/triton-slim \
    && export PYTHONPATH="/tmp/triton-slim/site:$PYTHONPATH"
  cuda_bin=$(dirname "$(command -v ptxas || ls /usr/local/cuda/bin/ptxas)")
  export TRITON_PTXAS_PATH="$cuda_bin/ptxas" TRITON_CUOBJDUMP_PATH="$cuda_bin/cuobjdump" TRITON_NVDISASM_PATH="$cuda_bin/nvdisasm"
fi
# Optional FlashKDA for the bench (not committed): its source tarball and a flash_kda_C*.so built on an H200
# before (MoonshotAI/FlashKDA's own build, about 90 s there) in .peers/; the bench finds `flash_kda` on the path.
if ls .peers/flashkda-*.tar.gz .peers/flash_kda_C*.so >/dev/null 2>&1; then
  mkdir -p /tmp/flashkda/build && tar xzf .peers/flashkda-*.tar.gz -C /tmp/flashkda && cp .peers/flash_kda_C*.so /tmp/flashkda/build/ \
    && export PYTHONPATH="$PYTHONPATH:/tmp/flashkda/build:$(dirname "$(find /tmp/flashkda -name __init__.py -path '*flash_kda/*' | head -n 1)")/.."
fi
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
python3 -m pytest tests/gpu -q -rs -s "$@" 2>&1 | tee "$OUT/gpu-tests.log"; rc=${PIPESTATUS[0]}
if [ "${KDAGEN_SKIP_BENCH:-0}" != 1 ]; then
  python3 -m kdagen bench ${KDAGEN_BENCH_ARGS:---quick} --out-dir "$OUT" 2>&1 | tee "$OUT/bench.log"
fi
echo "gpu tests exit code: $rc"
exit $rc
