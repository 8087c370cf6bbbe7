// Runtime stand-in entry points for graphs, executable graphs and user objects; thin calls into
// graph.cpp.
#include "rt_common.h"

using namespace poolcuda::sim;

cudaError_t cudaGraphCreate(cudaGraph_t* pGraph, unsigned int flags) {
  SIM_ENTER();
  if (!pGraph || flags != 0) SIM_RETURN(cudaErrorInvalidValue);
  *pGraph = register_graph(std::make_shared<Graph>());
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags) {
  SIM_ENTER();
  if (flags & ~0xfull) SIM_RETURN(cudaErrorInvalidValue);
  SIM_RETURN(graph_instantiate(pGraphExec, graph));
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                          unsigned long long flags) {
  SIM_ENTER();
  if (flags & ~0xfull) SIM_RETURN(cudaErrorInvalidValue);
  SIM_RETURN(graph_instantiate(pGraphExec, graph));
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(graph_launch(graphExec, resolve_stream(stream, false)));
}

cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream) {
  SIM_ENTER();
  SIM_RETURN(graph_launch(graphExec, resolve_stream(stream, true)));
}

cudaError_t cudaGraphClone(cudaGraph_t* pGraphClone, cudaGraph_t originalGraph) {
  SIM_ENTER();
  SIM_RETURN(graph_clone(pGraphClone, originalGraph));
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  SIM_ENTER();
  SIM_RETURN(graph_destroy(graph));
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  SIM_ENTER();
  SIM_RETURN(graph_exec_destroy(graphExec));
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* numNodes) {
  SIM_ENTER();
  SIM_RETURN(graph_get_nodes(graph, nodes, numNodes));
}

cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, cudaGraphNodeType* pType) {
  SIM_ENTER();
  SIM_RETURN(node_get_type(node, pType));
}

cudaError_t cudaUserObjectCreate(cudaUserObject_t* object_out, void* ptr, cudaHostFn_t destroy,
                                 unsigned int initialRefcount, unsigned int flags) {
  SIM_ENTER();
  SIM_RETURN(user_object_create(object_out, ptr, destroy, initialRefcount, flags));
}

cudaError_t cudaUserObjectRetain(cudaUserObject_t object, unsigned int count) {
  SIM_ENTER();
  SIM_RETURN(user_object_retain(object, count));
}

cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count) {
  SIM_ENTER();
  SIM_RETURN(user_object_release(object, count));
}

cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t object,
                                      unsigned int count, unsigned int flags) {
  SIM_ENTER();
  SIM_RETURN(graph_retain_user_object(graph, object, count, flags));
}

cudaError_t cudaGraphReleaseUserObject(cudaGraph_t graph, cudaUserObject_t object,
                                       unsigned int count) {
  SIM_ENTER();
  SIM_RETURN(graph_release_user_object(graph, object, count));
}
