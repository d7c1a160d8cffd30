// One MoE layer in the rank-major layout: dispatch sends each token once to every rank holding one of its
// experts (with its local experts and weights there), a stand-in for the experts scales each received row by
// the weights of its experts on this rank and writes it into combine_input, and combine sums every token's rows
// back on its own rank: out = x * (the sum of the token's weights).
//   braid-run -n 2 build/examples/example_moe_layer
#include <braid/braid.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "common.hpp"

// The experts' stand-in: for every received row, y = x * (sum of the row's local weights).
__global__ void scale_rows(const float* x, const float* topk_weights, const int32_t* topk_expert, const int64_t* received,
                           float* y, int world, size_t max_tokens, int top_k, size_t hidden) {
  for (size_t row = blockIdx.x; row < world * max_tokens; row += gridDim.x) {
    const size_t source = row / max_tokens;
    if (static_cast<int64_t>(row % max_tokens) >= received[source]) continue;  // not a received token
    float weight = 0.0f;
    for (int k = 0; k < top_k; ++k) weight += topk_expert[row * top_k + k] >= 0 ? topk_weights[row * top_k + k] : 0.0f;
    for (size_t h = threadIdx.x; h < hidden; h += blockDim.x) y[row * hidden + h] = x[row * hidden + h] * weight;
  }
}

int main() {
  try {
    braid::Communicator comm = braid::Communicator::init(braid::Rendezvous::from_env());
    EXAMPLE_CUDA(cudaSetDevice(comm.device()));
    const int world = comm.size(), me = comm.rank();
    const size_t hidden = 1024, tokens = 96;
    const int top_k = 2, experts = 4 * world;
    braid::MoeShape shape;
    shape.hidden = hidden;
    shape.type = braid::DataType::kFloat32;
    shape.max_tokens = 128;
    shape.top_k = top_k;
    shape.experts = experts;
    shape.layout = braid::MoeLayout::kRankMajor;
    braid::MoeBuffer moe = braid::MoeBuffer::create(comm, shape);

    // This rank's tokens and routing: distinct experts per token, weights in (0, 1].
    std::mt19937 random(1234 + me);
    std::vector<float> x(tokens * hidden), weights(tokens * top_k);
    std::vector<int64_t> ids(tokens * top_k);
    for (float& v : x) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(random);
    for (size_t t = 0; t < tokens; ++t) {
      for (int k = 0; k < top_k; ++k) {
        int64_t e;
        do e = std::uniform_int_distribution<int>(0, experts - 1)(random);
        while (std::find(&ids[t * top_k], &ids[t * top_k] + k, e) != &ids[t * top_k] + k);
        ids[t * top_k + k] = e;
        weights[t * top_k + k] = std::uniform_real_distribution<float>(0.05f, 1.0f)(random);
      }
    }
    float *d_x = nullptr, *d_weights = nullptr, *d_out = nullptr;
    int64_t* d_ids = nullptr;
    EXAMPLE_CUDA(cudaMalloc(&d_x, x.size() * sizeof(float)));
    EXAMPLE_CUDA(cudaMalloc(&d_weights, weights.size() * sizeof(float)));
    EXAMPLE_CUDA(cudaMalloc(&d_ids, ids.size() * sizeof(int64_t)));
    EXAMPLE_CUDA(cudaMalloc(&d_out, x.size() * sizeof(float)));
    EXAMPLE_CUDA(cudaMemcpy(d_x, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    EXAMPLE_CUDA(cudaMemcpy(d_weights, weights.data(), weights.size() * sizeof(float), cudaMemcpyHostToDevice));
    EXAMPLE_CUDA(cudaMemcpy(d_ids, ids.data(), ids.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    cudaStream_t stream;
    EXAMPLE_CUDA(cudaStreamCreate(&stream));

    const braid::MoeDispatchOutput got = moe.dispatch(d_x, d_ids, d_weights, tokens, nullptr, stream);
    scale_rows<<<256, 256, 0, stream>>>(static_cast<const float*>(got.x), got.topk_weights, got.topk_expert,
                                        got.received_tokens, static_cast<float*>(got.combine_input), world,
                                        shape.max_tokens, top_k, hidden);
    EXAMPLE_CUDA(cudaGetLastError());
    moe.combine(got.handle, got.combine_input, d_out, /*weighted=*/false, stream);
    EXAMPLE_CUDA(cudaStreamSynchronize(stream));
    comm.check();

    std::vector<float> out(x.size());
    EXAMPLE_CUDA(cudaMemcpy(out.data(), d_out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t t = 0; t < tokens; ++t) {
      float weight = 0.0f;
      for (int k = 0; k < top_k; ++k) weight += weights[t * top_k + k];
      for (size_t h = 0; h < hidden; ++h) wrong += std::fabs(out[t * hidden + h] - x[t * hidden + h] * weight) > 1e-5f;
    }
    std::printf("rank %d: MoE layer of %zu tokens, %d experts on %d ranks: %s\n", me, tokens, experts, world,
                wrong == 0 ? "OK" : "WRONG");
    comm.barrier();  // no rank frees the buffer while a peer may still read it
    free_all(d_x, d_weights, d_ids, d_out);
    EXAMPLE_CUDA(cudaStreamDestroy(stream));
    return wrong == 0 ? 0 : 1;
  } catch (const braid::Error& error) {
    std::fprintf(stderr, "braid: %s\n", error.what());
    return 1;
  }
}
