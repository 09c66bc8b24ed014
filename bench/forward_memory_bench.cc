// nf-bench-forward-memory: what a model made to run forwards only (ModelOptions::gradients
// false: nf-eval's and nf-generate's) holds against a training model of the same shape: the
// bytes the CPU allocator has handed out once each has run one forward (parameters, buffers,
// one micro-batch in flight), and the time to create it (the training model initialises its
// parameters; the forward-only one, made as nf-eval's to be loaded, does not) and to run that
// forward.
// Defaults: the 2.7B config's layer (d 2560, 32 heads, ffn 10240, vocab 51200, seq 2048) in
// bf16, 2 layers. A layer adds its parameters and, to a training model, its fp32 gradients and
// kept activations: the difference of a --layers 3 run and a --layers 2 run is one layer's.
//
//   build/bench/nf-bench-forward-memory [--layers 2] [--seq 2048] [--dtype bf16|f32]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/allocator_usage.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/normformer_model.h"

namespace nf {
namespace {

struct Options {
  int layers = 2;
  int64_t seq = 2048;
  DType dtype = DType::kBF16;
};

struct Held {
  int64_t params = 0, bytes = 0;
  double create_seconds = 0, forward_seconds = 0;
};

absl::StatusOr<Held> Measure(const Options& o, bool gradients) {
  model::ModelConfig c;
  c.set_num_layers(o.layers);
  c.set_d_model(2560);
  c.set_num_heads(32);
  c.set_ffn_dim(10240);
  c.set_vocab_size(51200);
  c.set_max_seq_len(o.seq);
  const int64_t before = CpuAllocatorUsage().live_bytes;
  const auto start = std::chrono::steady_clock::now();
  NF_ASSIGN_OR_RETURN(auto model, model::NormFormerModel::Create(c, {.dtype = o.dtype,
                                                                     .micro_batch = 1,
                                                                     .seq_len = o.seq,
                                                                     .gradients = gradients,
                                                                     .initialize = gradients}));
  const auto created = std::chrono::steady_clock::now();
  NF_ASSIGN_OR_RETURN(const Tensor ids, Tensor::HostZeros(DType::kI32, {1, o.seq}));
  for (int64_t i = 0; i < o.seq; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>(i * 7 % 51200);
  NF_RETURN_IF_ERROR(model->ForwardStage(0, &ids, nullptr, ids, 0, /*train=*/false).status());
  const auto done = std::chrono::steady_clock::now();
  return Held{.params = static_cast<int64_t>(model->params().params().nbytes()),
              .bytes = CpuAllocatorUsage().live_bytes - before,
              .create_seconds = std::chrono::duration<double>(created - start).count(),
              .forward_seconds = std::chrono::duration<double>(done - created).count()};
}

int Run(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--layers") {
      o.layers = std::atoi(value.c_str());
    } else if (flag == "--seq") {
      o.seq = std::atoll(value.c_str());
    } else if (flag == "--dtype" && (value == "bf16" || value == "f32")) {
      o.dtype = value == "bf16" ? DType::kBF16 : DType::kF32;
    } else {
      std::fprintf(stderr, "nf-bench-forward-memory: unknown flag %s %s\n", flag.c_str(),
                   value.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0 || o.layers < 1 || o.seq < 1) {
    std::fprintf(stderr,
                 "usage: nf-bench-forward-memory [--layers N >= 1] [--seq S >= 1] "
                 "[--dtype bf16|f32]\n");
    return 2;
  }
  std::printf("%d layers of the 2.7B layer, seq %lld, %s, one micro-batch\n", o.layers,
              static_cast<long long>(o.seq), DTypeName(o.dtype).data());
  std::printf("%-14s %14s %14s %10s %10s\n", "model", "params B", "held B", "create s",
              "forward s");
  for (const bool gradients : {false, true}) {
    const absl::StatusOr<Held> held = Measure(o, gradients);
    if (!held.ok()) {
      std::fprintf(stderr, "nf-bench-forward-memory: %s\n", held.status().ToString().c_str());
      return 1;
    }
    std::printf("%-14s %14lld %14lld %10.1f %10.1f\n", gradients ? "training" : "forward-only",
                static_cast<long long>(held->params), static_cast<long long>(held->bytes),
                held->create_seconds, held->forward_seconds);
  }
  return 0;
}

}  // namespace
}  // namespace nf

int main(int argc, char** argv) { return nf::Run(argc, argv); }
