#!/bin/sh
# Preload suite: libpoolcuda.so exports CUDA entry points only (every defined dynamic symbol
# starts with "cu"), including each hooked runtime call, and it does not link libcudart. It
# also has no dynamic initialisers of namespace-scope objects: its hooks can run before the
# library is initialised (Note [Load order] in interpose/lifecycle.cpp), and must never see
# such an object unconstructed.
# Usage: check_exports.sh NM LIBRARY
set -u
nm_tool=$1
library=$2
symbols=$("$nm_tool" -D --defined-only "$library" | awk '{print $3}' | sed 's/@.*//')
status=0
for symbol in $symbols; do
  case $symbol in
    cu*|__cudaLaunchKernel*) ;;
    *) echo "exported but not a CUDA entry point: $symbol"; status=1 ;;
  esac
done
for hooked in cudaMalloc cudaFree cudaFreeAsync cudaFreeAsync_ptsz cudaMemGetInfo cudaDeviceReset \
              cudaStreamCreate \
              cudaStreamCreateWithFlags cudaStreamCreateWithPriority cudaStreamDestroy; do
  if ! echo "$symbols" | grep -qx "$hooked"; then
    echo "hooked entry point not exported: $hooked"
    status=1
  fi
done
initialisers=$("$nm_tool" "$library" 2>/dev/null | awk '{print $NF}' | grep '^_GLOBAL__sub_I')
if [ -n "$initialisers" ]; then
  echo "dynamic initialisers (make those objects constexpr or function-local):" $initialisers
  status=1
fi
if readelf -d "$library" 2>/dev/null | grep -q 'libcudart'; then
  echo "links libcudart"
  status=1
fi
[ $status -eq 0 ] && echo "ok: $(echo "$symbols" | wc -w) exported symbols, all CUDA entry points"
exit $status
