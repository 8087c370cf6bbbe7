// Preload test: every runtime copy and memset that may run on a thread's per-thread default
// stream counts as a use of that stream, so two threads that use theirs only through such a call
// take the device out of stream-ordered reuse (Note [Stream-ordered reuse] in
// interpose/stream_order.cpp): their two streams are not ordered with each other. Each call is
// tried in a child of its own (leaving ordered reuse is final): the device is ordered once the
// pools exist, two threads each make the call in its per-thread form (the _ptds or _ptsz entry
// point, or the legacy one given cudaStreamPerThread), and the library's report must then say
// `reuse: fenced`. The calls get null arguments: whatever they answer (the stand-in answers
// cudaErrorNotSupported for most), the library has seen the stream. The first child, whose two
// threads only allocate and free, must stay `ordered`: the report can tell the two apart.
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "signal_report.h"

// The per-thread-default-stream flavours, declared as a program built with
// -DCUDA_API_PER_THREAD_DEFAULT_STREAM sees them (the plain header does not declare them).
extern "C" {
cudaError_t cudaMemcpy2D_ptds(void*, size_t, const void*, size_t, size_t, size_t, cudaMemcpyKind);
cudaError_t cudaMemcpy2DFromArray_ptds(void*, size_t, cudaArray_const_t, size_t, size_t, size_t,
                                       size_t, cudaMemcpyKind);
cudaError_t cudaMemcpy2DToArray_ptds(cudaArray_t, size_t, size_t, const void*, size_t, size_t,
                                     size_t, cudaMemcpyKind);
cudaError_t cudaMemcpy3D_ptds(const cudaMemcpy3DParms*);
cudaError_t cudaMemcpy3DPeer_ptds(const cudaMemcpy3DPeerParms*);
cudaError_t cudaMemcpyFromArray_ptds(void*, cudaArray_const_t, size_t, size_t, size_t,
                                     cudaMemcpyKind);
cudaError_t cudaMemcpyToArray_ptds(cudaArray_t, size_t, size_t, const void*, size_t,
                                   cudaMemcpyKind);
cudaError_t cudaMemcpyFromSymbol_ptds(void*, const void*, size_t, size_t, cudaMemcpyKind);
cudaError_t cudaMemcpyToSymbol_ptds(const void*, const void*, size_t, size_t, cudaMemcpyKind);
cudaError_t cudaMemset2D_ptds(void*, size_t, int, size_t, size_t);
cudaError_t cudaMemset3D_ptds(cudaPitchedPtr, int, cudaExtent);
cudaError_t cudaMemcpy2DAsync_ptsz(void*, size_t, const void*, size_t, size_t, size_t,
                                   cudaMemcpyKind, cudaStream_t);
cudaError_t cudaMemcpy2DFromArrayAsync_ptsz(void*, size_t, cudaArray_const_t, size_t, size_t,
                                            size_t, size_t, cudaMemcpyKind, cudaStream_t);
cudaError_t cudaMemcpy2DToArrayAsync_ptsz(cudaArray_t, size_t, size_t, const void*, size_t,
                                          size_t, size_t, cudaMemcpyKind, cudaStream_t);
cudaError_t cudaMemcpy3DAsync_ptsz(const cudaMemcpy3DParms*, cudaStream_t);
cudaError_t cudaMemcpy3DPeerAsync_ptsz(const cudaMemcpy3DPeerParms*, cudaStream_t);
cudaError_t cudaMemcpy3DBatchAsync_ptsz(size_t, cudaMemcpy3DBatchOp*, unsigned long long,
                                        cudaStream_t);
cudaError_t cudaMemcpyBatchAsync_ptsz(void* const*, const void* const*, const size_t*, size_t,
                                      cudaMemcpyAttributes*, size_t*, size_t, cudaStream_t);
cudaError_t cudaMemcpyFromArrayAsync_ptsz(void*, cudaArray_const_t, size_t, size_t, size_t,
                                          cudaMemcpyKind, cudaStream_t);
cudaError_t cudaMemcpyToArrayAsync_ptsz(cudaArray_t, size_t, size_t, const void*, size_t,
                                        cudaMemcpyKind, cudaStream_t);
cudaError_t cudaMemcpyFromSymbolAsync_ptsz(void*, const void*, size_t, size_t, cudaMemcpyKind,
                                           cudaStream_t);
cudaError_t cudaMemcpyToSymbolAsync_ptsz(const void*, const void*, size_t, size_t,
                                         cudaMemcpyKind, cudaStream_t);
cudaError_t cudaMemset2DAsync_ptsz(void*, size_t, int, size_t, size_t, cudaStream_t);
cudaError_t cudaMemset3DAsync_ptsz(cudaPitchedPtr, int, cudaExtent, cudaStream_t);
}

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // the array copies

namespace {

using Call = std::pair<const char*, std::function<void()>>;

const cudaStream_t kPts = cudaStreamPerThread;
const cudaMemcpyKind kD2D = cudaMemcpyDeviceToDevice;
const cudaMemcpy3DParms kParms{};
const cudaMemcpy3DPeerParms kPeerParms{};

#define CALL(expr) Call{#expr, [] { (void)(expr); }}

// Every call, in its per-thread form. The first entry makes no such call at all.
const std::vector<Call>& calls() {
  static const std::vector<Call> all = {
      {"(no per-thread call)", [] {}},
      CALL(cudaMemcpy2D_ptds(nullptr, 0, nullptr, 0, 0, 0, kD2D)),
      CALL(cudaMemcpy2DFromArray_ptds(nullptr, 0, nullptr, 0, 0, 0, 0, kD2D)),
      CALL(cudaMemcpy2DToArray_ptds(nullptr, 0, 0, nullptr, 0, 0, 0, kD2D)),
      CALL(cudaMemcpy3D_ptds(&kParms)),
      CALL(cudaMemcpy3DPeer_ptds(&kPeerParms)),
      CALL(cudaMemcpyFromArray_ptds(nullptr, nullptr, 0, 0, 0, kD2D)),
      CALL(cudaMemcpyToArray_ptds(nullptr, 0, 0, nullptr, 0, kD2D)),
      CALL(cudaMemcpyFromSymbol_ptds(nullptr, nullptr, 0, 0, kD2D)),
      CALL(cudaMemcpyToSymbol_ptds(nullptr, nullptr, 0, 0, kD2D)),
      CALL(cudaMemset2D_ptds(nullptr, 0, 0, 0, 0)),
      CALL(cudaMemset3D_ptds(cudaPitchedPtr{}, 0, cudaExtent{})),
      CALL(cudaMemcpy2DAsync(nullptr, 0, nullptr, 0, 0, 0, kD2D, kPts)),
      CALL(cudaMemcpy2DAsync_ptsz(nullptr, 0, nullptr, 0, 0, 0, kD2D, nullptr)),
      CALL(cudaMemcpy2DFromArrayAsync(nullptr, 0, nullptr, 0, 0, 0, 0, kD2D, kPts)),
      CALL(cudaMemcpy2DFromArrayAsync_ptsz(nullptr, 0, nullptr, 0, 0, 0, 0, kD2D, nullptr)),
      CALL(cudaMemcpy2DToArrayAsync(nullptr, 0, 0, nullptr, 0, 0, 0, kD2D, kPts)),
      CALL(cudaMemcpy2DToArrayAsync_ptsz(nullptr, 0, 0, nullptr, 0, 0, 0, kD2D, nullptr)),
      CALL(cudaMemcpy3DAsync(&kParms, kPts)),
      CALL(cudaMemcpy3DAsync_ptsz(&kParms, nullptr)),
      CALL(cudaMemcpy3DPeerAsync(&kPeerParms, kPts)),
      CALL(cudaMemcpy3DPeerAsync_ptsz(&kPeerParms, nullptr)),
      CALL(cudaMemcpy3DBatchAsync(0, nullptr, 0, kPts)),
      CALL(cudaMemcpy3DBatchAsync_ptsz(0, nullptr, 0, nullptr)),
      CALL(cudaMemcpyBatchAsync(nullptr, nullptr, nullptr, 0, nullptr, nullptr, 0, kPts)),
      CALL(cudaMemcpyBatchAsync_ptsz(nullptr, nullptr, nullptr, 0, nullptr, nullptr, 0, nullptr)),
      CALL(cudaMemcpyFromArrayAsync(nullptr, nullptr, 0, 0, 0, kD2D, kPts)),
      CALL(cudaMemcpyFromArrayAsync_ptsz(nullptr, nullptr, 0, 0, 0, kD2D, nullptr)),
      CALL(cudaMemcpyToArrayAsync(nullptr, 0, 0, nullptr, 0, kD2D, kPts)),
      CALL(cudaMemcpyToArrayAsync_ptsz(nullptr, 0, 0, nullptr, 0, kD2D, nullptr)),
      CALL(cudaMemcpyFromSymbolAsync(nullptr, nullptr, 0, 0, kD2D, kPts)),
      CALL(cudaMemcpyFromSymbolAsync_ptsz(nullptr, nullptr, 0, 0, kD2D, nullptr)),
      CALL(cudaMemcpyToSymbolAsync(nullptr, nullptr, 0, 0, kD2D, kPts)),
      CALL(cudaMemcpyToSymbolAsync_ptsz(nullptr, nullptr, 0, 0, kD2D, nullptr)),
      CALL(cudaMemset2DAsync(nullptr, 0, 0, 0, 0, kPts)),
      CALL(cudaMemset2DAsync_ptsz(nullptr, 0, 0, 0, 0, nullptr)),
      CALL(cudaMemset3DAsync(cudaPitchedPtr{}, 0, cudaExtent{}, kPts)),
      CALL(cudaMemset3DAsync_ptsz(cudaPitchedPtr{}, 0, cudaExtent{}, nullptr)),
  };
  return all;
}

// The word after "reuse": in the first device's section.
std::string reuse_now() {
  const std::string report = preload_test::signal_report("PER_THREAD_REPORTS");
  const std::string key = "\"reuse\":\"";
  const std::size_t at = report.find(key);
  if (at == std::string::npos) return "(none)";
  const std::size_t from = at + key.size();
  return report.substr(from, report.find('"', from) - from);
}

void child(std::size_t which) {
  const Call& call = calls().at(which);
  CHECK_CUDA(cudaFree(nullptr));
  void* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, 4096));  // the pools exist from here on
  CHECK_CUDA(cudaFree(ptr));
  CHECK_MSG(reuse_now() == "ordered", std::string("before ") + call.first);
  for (int t = 0; t < 2; ++t) {
    std::thread([&] {
      void* own = nullptr;
      CHECK_CUDA(cudaMalloc(&own, 4096));
      call.second();
      (void)cudaGetLastError();  // null arguments: the call's answer does not matter
      CHECK_CUDA(cudaFree(own));
    }).join();
  }
  const std::string expected = which == 0 ? "ordered" : "fenced";
  const std::string reuse = reuse_now();
  CHECK_MSG(reuse == expected, std::string(call.first) + ": reuse is " + reuse);
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (argc == 2) {
    child(std::stoul(argv[1]));
    return 0;
  }
  char dir[] = "/tmp/poolcuda-per-thread-XXXXXX";
  CHECK(mkdtemp(dir) != nullptr);
  int failed = 0;
  for (std::size_t i = 0; i < calls().size(); ++i) {
    // Each child numbers its reports from 1: a folder of its own.
    const std::string sub = std::string(dir) + "/" + std::to_string(i);
    CHECK(::mkdir(sub.c_str(), 0700) == 0);
    const preload_test::ChildResult result = preload_test::run_self(
        std::to_string(i).c_str(),
        {"POOLCUDA_CONF=report_format:json,report_path:" + sub + "/r-%n.json",
         "PER_THREAD_REPORTS=" + sub},
        60);
    if (result.status != 0) {
      ++failed;
      std::printf("%s: child failed (status %d)\n%s\n", calls()[i].first, result.status,
                  result.output.c_str());
    }
  }
  std::system(("rm -rf '" + std::string(dir) + "'").c_str());
  CHECK_MSG(failed == 0, std::to_string(failed) + " of the calls were not seen");
  std::printf("ok: %zu calls\n", calls().size() - 1);
  return 0;
}
