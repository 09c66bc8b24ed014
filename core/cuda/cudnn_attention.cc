#include "core/cuda/cudnn_attention.h"

#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <array>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "core/cuda/attention_dispatch.h"
#include "core/cuda/write_scalars.h"
#include "core/status.h"

// With NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING the frontend reaches every cuDNN function through
// dlsym on this handle, which the program defines and sets (LoadCudnn): nothing links libcudnn,
// so the programs start on machines without it.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace nf::cuda {
namespace {

namespace fe = cudnn_frontend;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

// Tensor ids in the graphs and their variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeed, kOffset };

// Why cuDNN cannot run, said once on stderr where it is found (each cause is met once: the
// library and handle states and unsupported graphs are kept): a fallback is slower and should
// not go unnoticed.
absl::Status Unavailable(absl::string_view why) {
  absl::Status status =
      absl::UnimplementedError(absl::StrCat("cuDNN attention unavailable: ", why));
  std::fprintf(stderr, "normformer: %s; using the own attention kernel\n",
               std::string(status.message()).c_str());
  return status;
}

// dlopens libcudnn of the headers' major version, once per process.
const absl::Status& LoadCudnn() {
  static const absl::Status* const status = [] {
    const std::string name = absl::StrCat("libcudnn.so.", CUDNN_MAJOR);
    void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      return new absl::Status(Unavailable(absl::StrCat("cannot load ", name, ": ", dlerror())));
    }
    fe::cudnn_dlhandle = library;
    try {
      // cuDNN numbers versions major * 10000 + minor * 100 + patch.
      const size_t version = fe::detail::get_backend_version();
      if (version / 10000 != CUDNN_MAJOR) {
        return new absl::Status(Unavailable(absl::StrCat(name, " reports version ", version)));
      }
    } catch (const std::exception& e) {
      return new absl::Status(Unavailable(e.what()));
    }
    return new absl::Status();
  }();
  return *status;
}

// A call's key and its direction: one forward and one backward graph per call key. The scale
// and the dropout probability are in the key because a graph holds them as pass-by-value
// scalars, the causal flag because it decides the graph's mask.
struct GraphKey : AttentionCallKey {
  bool backward = false;
  auto operator<=>(const GraphKey&) const = default;
};

// A built graph and its workspace size, or why it could not be built (kept too, so that an
// unsupported shape is not rebuilt at every call).
struct BuiltGraph {
  absl::Status status;
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

// The process's cuDNN state: a handle per device and the graphs built so far. Graph building
// and execution share one handle per device, so calls hold the mutex while they use it.
struct CudnnState {
  std::mutex mutex;
  std::array<cudnnHandle_t, kMaxDevices> handles{};
  std::array<absl::Status, kMaxDevices> handle_status;
  std::map<GraphKey, BuiltGraph> graphs;
};

CudnnState& State() {
  static CudnnState* const state = new CudnnState;  // lives for the process, like the contexts
  return *state;
}

absl::StatusOr<cudnnHandle_t> HandleLocked(CudnnState& state, CudaContext& context) {
  NF_RETURN_IF_ERROR(LoadCudnn());
  const int device = context.device();
  if (state.handles[device] != nullptr) return state.handles[device];
  NF_RETURN_IF_ERROR(state.handle_status[device]);
  cudnnHandle_t handle = nullptr;
  absl::Status status;
  try {
    // cudnnCreate binds the handle to the current device.
    if (cudaSetDevice(device) != cudaSuccess) {
      status = Unavailable(absl::StrCat("cannot select cuda:", device));
    } else if (fe::detail::create_handle(&handle) != CUDNN_STATUS_SUCCESS) {
      status = Unavailable(absl::StrCat("cudnnCreate failed on cuda:", device));
    } else if (fe::detail::set_stream(handle, context.stream()) != CUDNN_STATUS_SUCCESS) {
      status = Unavailable("cudnnSetStream failed");
    }
  } catch (const std::exception& e) {
    status = Unavailable(e.what());
  }
  if (!status.ok()) {
    state.handle_status[device] = status;
    return status;
  }
  state.handles[device] = handle;
  return handle;
}

fe::DataType_t IoType(DType dtype) {
  return dtype == DType::kF16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

// A contiguous [batch, heads, seq, head_dim] tensor of the graph.
fe::graph::Tensor_attributes& SetBhsd(fe::graph::Tensor_attributes& t, const GraphKey& key) {
  return t.set_dim({key.batch, key.heads, key.seq, key.dim})
      .set_stride({key.heads * key.seq * key.dim, key.seq * key.dim, key.dim, 1});
}

TensorAttr BhsdInput(fe::graph::Graph& graph, const char* name, Uid uid, const GraphKey& key) {
  fe::graph::Tensor_attributes t;
  t.set_name(name).set_uid(uid);
  return graph.tensor(SetBhsd(t, key));
}

// lse fp32 [batch, heads, seq] as cuDNN's Stats [batch, heads, seq, 1]: the same bytes.
fe::graph::Tensor_attributes& SetStats(fe::graph::Tensor_attributes& t, const GraphKey& key) {
  return t.set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({key.batch, key.heads, key.seq, 1})
      .set_stride({key.heads * key.seq, key.seq, 1, 1});
}

// The Philox seed or offset of the dropout: one int64 in device memory.
TensorAttr RngInput(fe::graph::Graph& graph, const char* name, Uid uid) {
  fe::graph::Tensor_attributes t;
  t.set_name(name)
      .set_uid(uid)
      .set_dim({1, 1, 1, 1})
      .set_stride({1, 1, 1, 1})
      .set_data_type(fe::DataType_t::INT64);
  return graph.tensor(t);
}

// Adds the forward (out, lse from q, k, v) or backward (dq, dk, dv) operation to `graph`. With
// key.causal, query i attends keys j <= i (a diagonal band whose right bound is the diagonal,
// aligned top left); without, no mask: every key. With dropout, cuDNN drops the probabilities
// (scaled by 1 / (1 - p)) with a mask it draws from Philox under the seed and offset the call
// passes; the backward redraws the same mask.
void AddAttention(fe::graph::Graph& graph, const GraphKey& key) {
  const TensorAttr q = BhsdInput(graph, "q", kQ, key);
  const TensorAttr k = BhsdInput(graph, "k", kK, key);
  const TensorAttr v = BhsdInput(graph, "v", kV, key);
  const bool dropout = key.dropout();
  const TensorAttr seed = dropout ? RngInput(graph, "seed", kSeed) : nullptr;
  const TensorAttr offset = dropout ? RngInput(graph, "offset", kOffset) : nullptr;
  if (!key.backward) {
    auto options = fe::graph::SDPA_attributes()
                       .set_name("attention")
                       .set_generate_stats(true)  // training: the backward needs lse
                       .set_attn_scale(key.scale());
    if (key.causal) {
      options.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
          .set_diagonal_band_right_bound(0);  // key j <= query i
    }
    if (dropout) options.set_dropout(key.dropout_probability(), seed, offset);
    auto [out, stats] = graph.sdpa(q, k, v, options);
    SetBhsd(out->set_output(true).set_uid(kO), key);
    SetStats(stats->set_output(true), key);
    return;
  }
  const TensorAttr out = BhsdInput(graph, "out", kO, key);
  const TensorAttr dout = BhsdInput(graph, "dout", kDO, key);
  fe::graph::Tensor_attributes stats_attr;
  stats_attr.set_name("lse");
  const TensorAttr stats = graph.tensor(SetStats(stats_attr, key));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward")
                     .set_attn_scale(key.scale())
                     .set_deterministic_algorithm(true);  // no atomics: runs repeat exactly
  if (key.causal) {
    options.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
        .set_diagonal_band_right_bound(0);
  }
  if (dropout) options.set_dropout(key.dropout_probability(), seed, offset);
  auto [dq, dk, dv] = graph.sdpa_backward(q, k, v, out, dout, stats, options);
  SetBhsd(dq->set_output(true).set_uid(kDQ), key);
  SetBhsd(dk->set_output(true).set_uid(kDK), key);
  SetBhsd(dv->set_output(true).set_uid(kDV), key);
}

// Builds the graph of `key`: a graph cuDNN rejects on this GPU gives kUnimplemented.
BuiltGraph Build(const GraphKey& key, cudnnHandle_t handle, const cudaDeviceProp& properties) {
  BuiltGraph built;
  auto graph = std::make_shared<fe::graph::Graph>();
  const auto rejected = [&](const char* stage, fe::error_t error) {
    built.status = Unavailable(absl::StrCat(key.backward ? "backward" : "forward", " graph for ",
                                            key.ToString(), " ", stage, ": ", error.get_message()));
    return built;
  };
  try {
    graph->set_io_data_type(IoType(key.dtype))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT)
        .set_sm_version(properties.major * 10 + properties.minor);
    AddAttention(*graph, key);
    if (auto e = graph->validate(); e.is_bad()) return rejected("invalid", e);
    if (auto e = graph->build_operation_graph(handle); e.is_bad()) return rejected("not built", e);
    if (auto e = graph->create_execution_plans({fe::HeurMode_t::A}); e.is_bad()) {
      return rejected("has no plan", e);
    }
    if (auto e = graph->check_support(); e.is_bad()) return rejected("not supported", e);
    if (auto e = graph->build_plans(); e.is_bad()) return rejected("plans not built", e);
    if (auto e = graph->get_workspace_size(built.workspace_bytes); e.is_bad()) {
      return rejected("workspace unknown", e);
    }
  } catch (const std::exception& e) {
    built.status = Unavailable(e.what());
    return built;
  }
  built.graph = std::move(graph);
  return built;
}

// The graph of `key`, built on first use and kept (a graph cuDNN rejects is kept as its
// status). Holds state.mutex.
const BuiltGraph& GraphLocked(CudnnState& state, cudnnHandle_t handle, const CudaContext& context,
                              const GraphKey& key) {
  auto it = state.graphs.find(key);
  if (it == state.graphs.end()) {
    it = state.graphs.emplace(key, Build(key, handle, context.properties())).first;
  }
  return it->second;
}

// Runs the graph of `key` on the tensors of `pack` (uid -> device address); with dropout, writes
// the call's seed and offset (0) to the device first, on the same stream.
absl::Status Run(CudaContext& context, const GraphKey& key, const ops::DropoutSpec& dropout,
                 std::unordered_map<int64_t, void*>& pack) {
  CudnnState& state = State();
  std::lock_guard<std::mutex> lock(state.mutex);
  NF_ASSIGN_OR_RETURN(cudnnHandle_t handle, HandleLocked(state, context));
  const BuiltGraph& built = GraphLocked(state, handle, context, key);
  NF_RETURN_IF_ERROR(built.status);
  // Per call from the caching allocator (no cudaMalloc after the first): freed at return while
  // cuDNN's kernels may still run, which is safe because every user of the block runs on the
  // same stream after them.
  NF_ASSIGN_OR_RETURN(Tensor workspace,
                      Tensor::Empty(DType::kU8, {built.workspace_bytes}, context.allocator()));
  // Freed at return like the workspace: the kernel that writes it and cuDNN's that read it are
  // on the same stream as every later user of the block.
  Tensor rng;
  if (key.dropout()) {
    NF_ASSIGN_OR_RETURN(rng, Tensor::Empty(DType::kI64, {2}, context.allocator()));
    auto* seed_and_offset = static_cast<int64_t*>(rng.raw_data());
    const cudaError_t error =
        WriteInt64Pair(context.stream(), seed_and_offset, CudnnDropoutSeed(dropout), 0);
    if (error != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("cuDNN attention: writing the dropout seed: ", cudaGetErrorString(error)));
    }
    pack[kSeed] = seed_and_offset;
    pack[kOffset] = seed_and_offset + 1;
  }
  fe::error_t e;
  try {
    e = built.graph->execute(handle, pack, workspace.raw_data());
  } catch (const std::exception& ex) {
    return absl::InternalError(absl::StrCat("cuDNN attention: ", ex.what()));
  }
  if (e.is_bad()) {
    return absl::InternalError(absl::StrCat("cuDNN attention failed: ", e.get_message()));
  }
  return absl::OkStatus();
}

GraphKey KeyOf(const CudaContext& context, bool backward, const Tensor& q, float scale,
               const ops::DropoutSpec& dropout, bool causal) {
  return {AttentionKeyOf(context.device(), q, scale, dropout, causal), backward};
}

}  // namespace

absl::Status CudnnAvailable(CudaContext& context) {
  CudnnState& state = State();
  std::lock_guard<std::mutex> lock(state.mutex);
  return HandleLocked(state, context).status();
}

absl::Status CudnnAttentionForward(CudaContext& context, const ops::AttentionArgs& args) {
  std::unordered_map<int64_t, void*> pack = {{kQ, args.q.raw_data()},
                                             {kK, args.k.raw_data()},
                                             {kV, args.v.raw_data()},
                                             {kO, args.out.raw_data()},
                                             {kStats, args.lse.raw_data()}};
  return Run(context, KeyOf(context, false, args.q, args.scale, args.dropout, args.causal),
             args.dropout, pack);
}

absl::Status CudnnAttentionBackwardSupported(CudaContext& context, const ops::AttentionArgs& args) {
  CudnnState& state = State();
  std::lock_guard<std::mutex> lock(state.mutex);
  NF_ASSIGN_OR_RETURN(cudnnHandle_t handle, HandleLocked(state, context));
  return GraphLocked(state, handle, context,
                     KeyOf(context, true, args.q, args.scale, args.dropout, args.causal))
      .status;
}

absl::Status CudnnAttentionBackward(CudaContext& context, const ops::AttentionBackwardArgs& args) {
  std::unordered_map<int64_t, void*> pack = {
      {kQ, args.q.raw_data()},   {kK, args.k.raw_data()},     {kV, args.v.raw_data()},
      {kO, args.out.raw_data()}, {kDO, args.dout.raw_data()}, {kStats, args.lse.raw_data()},
      {kDQ, args.dq.raw_data()}, {kDK, args.dk.raw_data()},   {kDV, args.dv.raw_data()}};
  return Run(context, KeyOf(context, true, args.q, args.scale, args.dropout, args.causal),
             args.dropout, pack);
}

}  // namespace nf::cuda
