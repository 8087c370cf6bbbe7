#!/bin/sh
# Preload suite: libpoolcuda.so exports CUDA entry points, dlsym, pthread_exit and its marker
# symbol only (every other defined dynamic symbol starts with "cu"), including each hooked
# runtime and driver call, dlsym and pthread_exit are unversioned (they must stand in for every
# version callers were linked against), and the library links neither libcudart nor libcuda. It
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
    cu*|__cudaLaunchKernel*|dlsym|pthread_exit|poolcuda_library_marker) ;;
    *) echo "exported but not a CUDA entry point: $symbol"; status=1 ;;
  esac
done
if "$nm_tool" -D --defined-only "$library" | awk '{print $3}' |
    grep -Eq '^(dlsym|pthread_exit)@'; then
  echo "dlsym or pthread_exit is exported with a version"
  status=1
fi
for hooked in poolcuda_library_marker cudaMalloc cudaFree cudaFreeAsync cudaFreeAsync_ptsz cudaMemGetInfo cudaDeviceReset \
              cudaMallocAsync cudaMallocAsync_ptsz \
              cudaStreamCreate cudaMallocManaged cudaStreamAttachMemAsync cudaMemAdvise \
              cudaMemPrefetchAsync cudaPointerGetAttributes \
              cudaStreamCreateWithFlags cudaStreamCreateWithPriority cudaStreamDestroy \
              cudaGetDriverEntryPoint cudaGetDriverEntryPointByVersion dlsym pthread_exit \
              cuGetProcAddress cuGetProcAddress_v2 cuMemAlloc_v2 cuMemFree_v2 cuMemGetInfo_v2 \
              cuMemFreeAsync cuMemFreeAsync_ptsz cuMemAllocAsync cuMemAllocAsync_ptsz cudaMallocPitch \
              cuMemAllocPitch_v2 cuMemAllocManaged cuStreamCreate cuStreamCreateWithPriority \
              cuStreamDestroy cuStreamDestroy_v2 cuDevicePrimaryCtxReset_v2 \
              cuDevicePrimaryCtxRelease_v2 cuCtxDestroy cuCtxDestroy_v2 cuStreamBeginCapture cuStreamBeginCapture_v2 \
              cuStreamBeginCapture_v2_ptsz cuStreamBeginCaptureToGraph cuStreamEndCapture \
              cuStreamEndCapture_ptsz cudaGraphDestroy cudaGraphExecDestroy cuGraphDestroy \
              cuGraphExecDestroy cuMemCreate cuArrayCreate_v2 cuArray3DCreate_v2 \
              cuMemAllocFromPoolAsync cuMemAllocFromPoolAsync_ptsz cuMemGetAddressRange_v2 \
              cuCtxSynchronize cudaDeviceSynchronize cuCtxSynchronize_v2 cuCtxSetLimit \
              cuMipmappedArrayCreate cuLaunchKernel cuLaunchKernel_ptsz cuLaunchKernelEx \
              cuLaunchKernelEx_ptsz cuLaunchCooperativeKernel cuLaunchCooperativeKernel_ptsz \
              cuModuleLoad cuModuleLoadData cuModuleLoadDataEx cuModuleLoadFatBinary \
              cuLibraryLoadData cuLibraryLoadFromFile cuModuleGetFunction cuLibraryGetKernel \
              cuKernelGetFunction cuFuncLoad cuFuncGetAttribute cuFuncSetAttribute \
              cuFuncSetCacheConfig cuKernelGetAttribute cuKernelSetAttribute \
              cuKernelSetCacheConfig cuOccupancyMaxActiveBlocksPerMultiprocessor \
              cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags \
              cuOccupancyMaxPotentialBlockSize cuOccupancyMaxPotentialBlockSizeWithFlags \
              cuOccupancyAvailableDynamicSMemPerBlock cuOccupancyMaxPotentialClusterSize \
              cuOccupancyMaxActiveClusters cuModuleGetGlobal_v2 cuLibraryGetGlobal; do
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
if readelf -d "$library" 2>/dev/null | grep -Eq 'libcudart|libcuda\.so'; then
  echo "links libcudart or libcuda"
  status=1
fi
[ $status -eq 0 ] &&
  echo "ok: $(echo "$symbols" | wc -w) exported symbols: CUDA entry points, dlsym, pthread_exit"
exit $status
