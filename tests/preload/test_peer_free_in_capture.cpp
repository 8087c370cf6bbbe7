// Preload test: device-0 memory freed with cudaFreeAsync on a device-1 stream while a capture is
// open on device 0 (Note [Stream-ordered frees of pinned slices] in pools/manager_api.cpp). The
// device-1 stream is parked on a host function, then writes the buffer (peer access) and frees
// it there; the capture ends and its graph is destroyed; then device 0 allocates and fills twenty
// buffers of the same size. None may be the freed one until the device-1 stream has made its
// write: the release at the graph's destroy used to fence the slice on device 0's streams only,
// the buffer went to a new owner at once, and the late write replaced its bytes. Each free
// fence mode that fences (auto, events, sync) is run in a child. Under capture_share:on, a
// second capture's allocation must not be handed that buffer before the device-1 stream has
// written it either: the reissue looked at the window's fence only (device 0's).
#include <unistd.h>

#include <atomic>
#include <vector>

#include "check.h"

namespace {

constexpr std::size_t kBuffer = 1 << 20;
std::atomic<bool> g_gate{false};

void wait_for_gate(void*) {
  while (!g_gate.load()) ::usleep(1000);
}

// Streams of device 0 (`mine`, `capturing`) and device 1 (`peer`, with access to device 0's
// memory), and a capture open on `capturing` during which `peer`, parked on the gate, writes
// `freed` and frees it (cudaFreeAsync): the capture is left open for the caller to end.
struct PeerFree {
  cudaStream_t mine = nullptr;
  cudaStream_t capturing = nullptr;
  cudaStream_t peer = nullptr;
  void* freed = nullptr;
};

PeerFree free_on_peer_during_capture() {
  PeerFree setup;
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaStreamCreateWithFlags(&setup.mine, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&setup.capturing, cudaStreamNonBlocking));
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamCreateWithFlags(&setup.peer, cudaStreamNonBlocking));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaMalloc(&setup.freed, kBuffer));
  CHECK_CUDA(cudaMemset(setup.freed, 0, kBuffer));
  void* captured = nullptr;
  CHECK_CUDA(cudaMalloc(&captured, 4096));
  CHECK_CUDA(cudaStreamBeginCapture(setup.capturing, cudaStreamCaptureModeRelaxed));
  CHECK_CUDA(cudaMemsetAsync(captured, 1, 4096, setup.capturing));
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaLaunchHostFunc(setup.peer, wait_for_gate, nullptr));
  CHECK_CUDA(cudaMemsetAsync(setup.freed, 0xaa, kBuffer, setup.peer));  // held behind the gate
  CHECK_CUDA(cudaFreeAsync(setup.freed, setup.peer));
  CHECK_CUDA(cudaSetDevice(0));
  return setup;
}

// Opens the gate, waits for the peer stream, and checks that `buffer` still holds 0xbb.
void open_gate_and_check(const PeerFree& setup, void* buffer) {
  g_gate = true;
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamSynchronize(setup.peer));
  CHECK_CUDA(cudaSetDevice(0));
  std::vector<unsigned char> bytes(kBuffer);
  CHECK_CUDA(cudaMemcpy(bytes.data(), buffer, kBuffer, cudaMemcpyDeviceToHost));
  for (unsigned char b : bytes) CHECK_MSG(b == 0xbb, "a new buffer got the old owner's write");
}

int child() {
  const PeerFree setup = free_on_peer_during_capture();
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(setup.capturing, &graph));
  CHECK_CUDA(cudaGraphDestroy(graph));
  std::vector<void*> fresh(20);
  for (void*& p : fresh) {
    CHECK_CUDA(cudaMalloc(&p, kBuffer));
    CHECK_CUDA(cudaMemsetAsync(p, 0xbb, kBuffer, setup.mine));
    CHECK_CUDA(cudaStreamSynchronize(setup.mine));
  }
  for (void* p : fresh) open_gate_and_check(setup, p);
  std::printf("case done\n");
  return 0;
}

int reissue_child() {
  const PeerFree setup = free_on_peer_during_capture();
  cudaGraph_t first = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(setup.capturing, &first));
  void* fresh = nullptr;
  cudaGraph_t second = nullptr;
  CHECK_CUDA(cudaStreamBeginCapture(setup.capturing, cudaStreamCaptureModeRelaxed));
  CHECK_CUDA(cudaMalloc(&fresh, kBuffer));
  CHECK_CUDA(cudaMemsetAsync(fresh, 0xbb, kBuffer, setup.capturing));
  CHECK_CUDA(cudaStreamEndCapture(setup.capturing, &second));
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&exec, second, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, setup.capturing));
  CHECK_CUDA(cudaStreamSynchronize(setup.capturing));
  open_gate_and_check(setup, fresh);
  std::printf("case done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  preload_test::require_preloaded();
  if (!preload_test::on_stand_in()) preload_test::skip("needs the stand-in's second device");
  if (argc > 1 && std::string(argv[1]) == "child") return child();
  if (argc > 1 && std::string(argv[1]) == "reissue") return reissue_child();
  for (const char* mode : {"auto", "events", "sync"}) {
    const preload_test::ChildResult result =
        preload_test::run_self("child", {std::string("POOLCUDA_CONF=free_fence:") + mode}, 60);
    CHECK_MSG(result.status == 0 && result.output.find("case done") != std::string::npos,
              std::string(mode) + ": " + result.output);
    std::printf("free_fence:%s: ok\n", mode);
  }
  const preload_test::ChildResult shared =
      preload_test::run_self("reissue", {"POOLCUDA_CONF=capture_share:on"}, 60);
  CHECK_MSG(shared.status == 0 && shared.output.find("case done") != std::string::npos,
            "capture_share:on: " + shared.output);
  std::printf("capture_share:on: ok\n");
  return 0;
}
