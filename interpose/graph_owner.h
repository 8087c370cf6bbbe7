// Ties the memory a capture pinned to the life of its graph: one CUDA user object per graph,
// moved into the graph, whose destructor runs when the graph, its clones, its executable graphs
// and their running launches are all gone (Note [Graph lifetimes] in capture/capture_policy.cpp).
//
// Depends on the capture policy and the real-function table.
#pragma once

#include <cuda_runtime_api.h>

#include "capture/capture_policy.h"

namespace poolcuda {

// Hands `set` to `graph`. False when CUDA refused (the caller then releases the set at once:
// nothing else would ever release it).
bool attach_to_graph(cudaGraph_t graph, int device, PinSet* set);

}  // namespace poolcuda
