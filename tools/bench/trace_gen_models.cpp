// The model traces: an LLM-serving loop and a training loop, written as the sequence of
// tensor allocations a framework without its own cache would make. Shapes follow a LLaMA-7B-like
// decoder (serving) and a small GPT-like model (training); the sizes are the tensors' bytes in
// fp16 (fp32 for optimizer state). See docs/benchmarks.md for what each trace models.
#include <deque>

#include "tools/bench/trace_build.h"
#include "tools/bench/trace_gen.h"

namespace poolcuda::bench {
namespace {

constexpr std::uint64_t kFp16 = 2;
constexpr std::uint64_t kFp32 = 4;

}  // namespace

// Serving: hidden 4096, 32 layers, MLP 11008, vocabulary 32000. Each step runs one batch: the
// prompts of newly admitted requests (prefill) plus one token of every running request, 1 to
// 4096 tokens in all. Per layer it allocates and frees the activations of that batch; each
// request keeps one K and one V buffer per layer, grown in 128-token chunks (a new buffer, then
// the old one freed) and freed when the request finishes. Admission keeps the KV cache within
// 12,288 tokens (6 GiB).
Trace llm_serving(std::uint64_t steps, const GenOptions& options) {
  constexpr std::uint64_t kHidden = 4096, kLayers = 32, kMlp = 11008, kVocab = 32000;
  constexpr std::uint64_t kMaxBatch = 4096, kChunk = 128, kKvBudget = 12288;
  constexpr std::uint64_t kTokenBytes = kHidden * kFp16;  // one token of one K or V buffer

  struct Request {
    std::uint64_t prompt = 0, output = 0;  // tokens
    std::uint64_t length = 0;              // tokens in the cache
    std::uint64_t capacity = 0;            // tokens the K/V buffers hold
    std::vector<std::uint32_t> k, v;       // one buffer per layer
  };
  Trace trace = empty_trace("llm-serving", 1, options.seed);
  Rng rng(Rng::derive(options.seed, 0));
  ThreadBuilder b(trace, 0);
  std::deque<Request> waiting;
  std::vector<Request> running;
  std::uint64_t kv_reserved = 0;  // tokens promised to running requests (prompt + output)
  auto chunks = [](std::uint64_t tokens) { return (tokens + kChunk - 1) / kChunk * kChunk; };

  const std::uint64_t total_steps = scaled(steps, options.scale, 3);
  for (std::uint64_t step = 0; step < total_steps; ++step) {
    // Arrivals: 0 to 3 requests, prompts log-uniform 1..3072 tokens, outputs 1..256 tokens.
    for (std::uint64_t n = rng.uniform(0, 3); n > 0; --n) {
      Request r;
      r.prompt = rng.log_uniform(1, 3072);
      r.output = rng.uniform(1, 256);
      waiting.push_back(std::move(r));
    }
    std::uint64_t tokens = running.size();
    std::vector<Request> admitted;
    while (!waiting.empty()) {
      const Request& next = waiting.front();
      const std::uint64_t need = chunks(next.prompt + next.output);
      if (tokens + next.prompt > kMaxBatch || kv_reserved + need > kKvBudget) break;
      tokens += next.prompt;
      kv_reserved += need;
      admitted.push_back(std::move(waiting.front()));
      waiting.pop_front();
    }
    for (Request& r : running) r.length += 1;
    for (Request& r : admitted) {
      r.length = r.prompt;
      r.k.assign(kLayers, 0);
      r.v.assign(kLayers, 0);
      running.push_back(std::move(r));
    }
    if (tokens == 0) continue;

    const std::uint32_t hidden = b.allocate(tokens * kHidden * kFp16);
    for (std::uint64_t layer = 0; layer < kLayers; ++layer) {
      const std::uint32_t norm = b.allocate(tokens * kHidden * kFp16);
      const std::uint32_t qkv = b.allocate(tokens * 3 * kHidden * kFp16);
      b.release(norm);
      for (Request& r : running) {  // the cache grows where this step's tokens overflow it
        if (r.length <= r.capacity) continue;
        const std::uint64_t capacity = chunks(r.length);
        for (std::vector<std::uint32_t>* kv : {&r.k, &r.v}) {
          const std::uint32_t grown = b.allocate(capacity * kTokenBytes);
          if (r.capacity != 0) b.release((*kv)[layer]);
          (*kv)[layer] = grown;
        }
        if (layer + 1 == kLayers) r.capacity = capacity;
      }
      const std::uint32_t attn = b.allocate(tokens * kHidden * kFp16);
      b.release(qkv);
      const std::uint32_t proj = b.allocate(tokens * kHidden * kFp16);
      b.release(attn);
      b.release(proj);  // added into the residual stream
      const std::uint32_t norm2 = b.allocate(tokens * kHidden * kFp16);
      const std::uint32_t gate = b.allocate(tokens * kMlp * kFp16);
      const std::uint32_t up = b.allocate(tokens * kMlp * kFp16);
      b.release(norm2);
      const std::uint32_t act = b.allocate(tokens * kMlp * kFp16);
      b.release(gate);
      b.release(up);
      const std::uint32_t down = b.allocate(tokens * kHidden * kFp16);
      b.release(act);
      b.release(down);
    }
    const std::uint32_t final_norm = b.allocate(tokens * kHidden * kFp16);
    const std::uint32_t logits = b.allocate(running.size() * kVocab * kFp16);
    b.release(final_norm);
    b.release(hidden);
    b.release(logits);

    // Finished requests free their cache.
    std::vector<Request> still;
    for (Request& r : running) {
      if (r.length < r.prompt + r.output) {
        still.push_back(std::move(r));
        continue;
      }
      for (std::uint64_t layer = 0; layer < kLayers; ++layer) {
        b.release(r.k[layer]);
        b.release(r.v[layer]);
      }
      kv_reserved -= chunks(r.prompt + r.output);
    }
    running = std::move(still);
  }
  for (Request& r : running) {
    for (std::uint64_t layer = 0; layer < kLayers; ++layer) {
      b.release(r.k[layer]);
      b.release(r.v[layer]);
    }
  }
  return trace;
}

// Training: 16 layers, hidden 1024, MLP 4096, vocabulary 32000, 16 heads, 4 sequences a step
// of 128..1024 tokens each (multiples of 8). Weights are allocated first and live throughout;
// Adam's two fp32 moments are allocated at the first optimizer step and live throughout.
// Forward keeps each layer's activations for backward; backward frees them last-in first-out
// while it allocates the gradients of activations and (at first use in the step) of weights;
// the optimizer allocates one fp32 temporary per weight; zero_grad frees the weight gradients.
Trace training(std::uint64_t steps, const GenOptions& options) {
  constexpr std::uint64_t kHidden = 1024, kLayers = 16, kMlp = 4096, kVocab = 32000;
  constexpr std::uint64_t kHeads = 16, kBatch = 4;

  Trace trace = empty_trace("training", 1, options.seed);
  Rng rng(Rng::derive(options.seed, 0));
  ThreadBuilder b(trace, 0);

  // Weight shapes in elements: embedding, then per layer two norms, qkv, out, up, down (each
  // linear with its bias), then the final norm.
  std::vector<std::uint64_t> shapes = {kVocab * kHidden};
  std::vector<std::size_t> layer_first;  // index of each layer's first weight
  for (std::uint64_t l = 0; l < kLayers; ++l) {
    layer_first.push_back(shapes.size());
    for (std::uint64_t e : {kHidden, kHidden, kHidden * 3 * kHidden, 3 * kHidden,
                            kHidden * kHidden, kHidden, kHidden * kMlp, kMlp, kMlp * kHidden,
                            kHidden}) {
      shapes.push_back(e);
    }
  }
  shapes.push_back(kHidden);
  const std::size_t per_layer = (shapes.size() - 2) / kLayers;

  std::vector<std::uint32_t> weights, moments;
  for (std::uint64_t e : shapes) weights.push_back(b.allocate(e * kFp16));
  std::vector<std::uint32_t> grads(shapes.size(), 0);
  std::vector<bool> has_grad(shapes.size(), false);
  auto grad_of = [&](std::size_t w) {
    if (!has_grad[w]) grads[w] = b.allocate(shapes[w] * kFp16);
    has_grad[w] = true;
  };

  const std::uint64_t total_steps = scaled(steps, options.scale, 2);
  for (std::uint64_t step = 0; step < total_steps; ++step) {
    const std::uint64_t seq = rng.uniform(16, 128) * 8;
    const std::uint64_t tokens = kBatch * seq;
    const std::uint64_t h = tokens * kHidden * kFp16, m = tokens * kMlp * kFp16;
    // Forward: what each layer keeps for backward, in allocation order.
    std::vector<std::vector<std::uint32_t>> saved(kLayers);
    std::uint32_t x = b.allocate(h);  // embedding output
    for (std::uint64_t l = 0; l < kLayers; ++l) {
      std::vector<std::uint32_t>& keep = saved[l];
      keep.push_back(x);
      keep.push_back(b.allocate(h));                                  // norm 1
      keep.push_back(b.allocate(3 * h));                              // qkv
      keep.push_back(b.allocate(kBatch * kHeads * seq * kFp32));      // softmax statistics
      keep.push_back(b.allocate(h));                                  // attention output
      const std::uint32_t proj = b.allocate(h);
      const std::uint32_t mid = b.allocate(h);                        // residual
      b.release(proj);
      keep.push_back(mid);
      keep.push_back(b.allocate(h));                                  // norm 2
      keep.push_back(b.allocate(m));                                  // up
      keep.push_back(b.allocate(m));                                  // activation
      const std::uint32_t down = b.allocate(h);
      x = b.allocate(h);                                              // residual out
      b.release(down);
    }
    const std::uint32_t final_norm = b.allocate(h);
    const std::uint32_t logits = b.allocate(tokens * kVocab * kFp16);
    const std::uint32_t loss = b.allocate(kFp32);
    // Backward.
    std::uint32_t grad = b.allocate(tokens * kVocab * kFp16);
    b.release(loss);
    b.release(logits);
    grad_of(0);  // tied output head
    grad_of(shapes.size() - 1);
    std::uint32_t next = b.allocate(h);
    b.release(grad);
    grad = next;
    b.release(final_norm);
    b.release(x);
    for (std::uint64_t l = kLayers; l-- > 0;) {
      for (std::size_t w = 0; w < per_layer; ++w) grad_of(layer_first[l] + w);
      std::vector<std::uint32_t>& keep = saved[l];
      while (!keep.empty()) {
        const std::uint32_t workspace = b.allocate(h);
        next = b.allocate(h);
        b.release(workspace);
        b.release(grad);
        grad = next;
        b.release(keep.back());
        keep.pop_back();
      }
    }
    b.release(grad);
    // Optimizer, then zero_grad (gradients set to none).
    const bool first = moments.empty();
    for (std::size_t w = 0; w < shapes.size(); ++w) {
      if (first) {
        moments.push_back(b.allocate(shapes[w] * kFp32));
        moments.push_back(b.allocate(shapes[w] * kFp32));
      }
      b.release(b.allocate(shapes[w] * kFp32));
    }
    for (std::size_t w = 0; w < shapes.size(); ++w) {
      if (has_grad[w]) b.release(grads[w]);
      has_grad[w] = false;
    }
  }
  for (std::uint32_t slot : moments) b.release(slot);
  for (std::uint32_t slot : weights) b.release(slot);
  return trace;
}

}  // namespace poolcuda::bench
