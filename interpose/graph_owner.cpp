// attach_to_graph (see graph_owner.h).
//
// The destructor runs where no CUDA call is allowed, on a thread internal to CUDA or on the
// thread that drops the last reference, inside that call (a GPU does the latter): it only posts
// the pin set to its policy's lock-free release queue, which is safe from either. The user object is created with a
// reference the graph takes over (cudaGraphUserObjectMove), so the graph's copies are its only
// owners; if the retain fails, releasing that reference runs the destructor, and the pins go.
#include "interpose/graph_owner.h"

#include "interpose/log.h"
#include "interpose/own_call.h"
#include "interpose/own_api.h"

namespace poolcuda {

namespace {

void CUDART_CB graph_gone(void* payload) {
  auto* set = static_cast<PinSet*>(payload);
  set->owner->post_release(set);
}

}  // namespace

bool attach_to_graph(cudaGraph_t graph, int device, PinSet* set) {
  OwnCallScope scope(device);
  cudaUserObject_t object = nullptr;
  if (own::cudaUserObjectCreate()(&object, set, &graph_gone, 1,
                                   cudaUserObjectNoDestructorSync) != cudaSuccess) {
    log_format(LogLevel::basic,
               "device %d: cannot tie %zu pinned slices to graph %p; they are released now and "
               "the graph must not be launched after its buffers are freed",
               device, set->pins.size(), static_cast<void*>(graph));
    return false;
  }
  if (own::cudaGraphRetainUserObject()(graph, object, 1, cudaGraphUserObjectMove) !=
      cudaSuccess) {
    own::cudaUserObjectRelease()(object, 1);  // runs graph_gone: the pins are released
    log_format(LogLevel::basic, "device %d: graph %p refused its pinned memory; released now",
               device, static_cast<void*>(graph));
  }
  return true;
}

}  // namespace poolcuda
