// The NormFormer language model on one tensor-parallel rank (or on one rank alone): token
// embedding (scaled by sqrt(d_model)),
// sinusoidal or learned positions, embedding dropout, the decoder layers, the final
// LayerNorm, the LM head (tied to the embedding by default) and the cross-entropy loss over
// the real vocabulary (padding rows are never predicted). A masked LM (ModelConfig::objective)
// is the same network with bidirectional attention and RoBERTa's head: dense, activation and
// LayerNorm before the projection, and a vocab-parallel output bias after it; its targets are
// -1 except at the tokens the data chose. Under tensor parallelism the
// embedding and LM head hold a vocabulary slice (vocab-parallel embedding and cross-entropy),
// the layers their heads and ffn columns (model/tensor_parallel.h); everything else, and the
// loss, is replicated. With sequence parallelism the hidden states and the work outside the
// tensor-parallel GEMMs are split by rows instead (model/tensor_parallel.h).
//
// Forward runs one micro-batch and keeps what Backward needs; Backward accumulates fp32
// parameter gradients into the ParamTable. With full activation recompute, only each layer's
// input is kept and its Forward re-runs inside Backward; with selective recompute, everything
// but the attention core's outputs, which the backward computes again. Both: less memory,
// bit-identical results (dropout masks are recomputed from the same Philox coordinates).
//
// Under pipeline parallelism the object is one stage (ModelOptions::pipeline): a contiguous
// range of layers under their global names and dropout sites, the embedding on the first
// stage, the final LayerNorm, head and loss on the last. ForwardStage / BackwardStage pass
// hidden states (hidden_shape()) and their gradients between stages; Forward / Backward are the
// one-stage case. A pipeline schedule keeps several micro-batches in flight on a stage (up to
// p - r on rank r under 1F1B): each ForwardStage keeps its micro-batch's activations under the
// caller's key until BackwardStage with that key, which returns them to a pool the next
// forwards reuse, so a stage allocates only for its peak number in flight.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/decoder_layer.h"
#include "model/model_config.pb.h"
#include "model/normformer_params.h"
#include "model/param_table.h"
#include "parallel/communicator.h"

namespace nf::model {

// Activation recompute: what a micro-batch keeps for its backward.
enum class Recompute {
  kNone,       // every layer's activations
  kSelective,  // all but the attention core's outputs, recomputed from q, k, v in the backward
               // (LayerOptions::recompute_attention)
  kFull,       // each layer's input only; the layer's forward re-runs inside the backward
};

struct ModelOptions {
  DType dtype = DType::kF32;  // parameters and activations
  int64_t micro_batch = 1;
  int64_t seq_len = 1;
  Recompute recompute = Recompute::kNone;
  uint32_t seed = 1;  // initialisation and dropout
  // Where parameters, gradients and activations live (a GPU needs the CUDA backend). Inputs
  // and targets may be on the host: the model copies them in.
  Device device = Device::Cpu();
  // The flat parameter buffers are padded to a multiple of this (the data-parallel size).
  int64_t param_buffer_multiple = 1;
  // The tensor-parallel group (must outlive the model); null: no tensor parallelism.
  parallel::Communicator* tensor_parallel = nullptr;
  // Sequence parallelism (model/tensor_parallel.h): with tp > 1, the hidden states between
  // layers and stages, and everything outside the tensor-parallel GEMMs, hold this rank's
  // [T / tp, d] rows; the replicated parameters' gradients are then partial
  // (SequenceParallelGradRanges). micro_batch * seq_len must divide by tp.
  bool sequence_parallel = false;
  // Column-parallel backwards reduce their input gradient while computing their weight gradient
  // (model/tensor_parallel.h): bit-identical results either way.
  bool overlap_tensor_parallel_comm = true;
  // The pipeline stage this object is; the default is the whole model.
  PipelineStagePlacement pipeline = {};
  // False: a model that only runs forwards (evaluation, generation): no gradient buffer (the
  // size of the parameters in fp32), no backward buffers, and one set of layer activations
  // shared by every layer (as full recompute keeps); Backward is refused.
  bool gradients = true;
  // False: the parameters start at zero, for a model its caller loads or copies parameters into
  // right away (nf-eval, nf-generate): drawing the 2.7B's initial values takes about 45 s here.
  bool initialize = true;
};

// The layer shape of one micro-batch on tensor-parallel rank tp_rank of tp_size, and the
// layers' switches, as the model resolves them from its config.
LayerShape LayerShapeOf(const ModelConfig& config, const ModelOptions& options, int tp_rank,
                        int tp_size);
LayerOptions LayerOptionsOf(const ModelConfig& config, Recompute recompute);

class NormFormerModel {
 public:
  static absl::StatusOr<std::unique_ptr<NormFormerModel>> Create(const ModelConfig& config,
                                                                 const ModelOptions& options);
  // The bytes a stage (options.pipeline) on one of tp_size tensor-parallel ranks allocates once
  // beside its parameters, gradients and micro-batches in flight: the layers' scratch, the
  // residual-stream gradients, one layer's activations under full recompute, the first stage's
  // sinusoidal table, the last stage's loss buffers. For memory plans (launcher/memory_estimate.h).
  static int64_t BufferBytes(const ModelConfig& config, const ModelOptions& options, int tp_size);
  // The bytes one micro-batch in flight on that stage keeps from its forward to its backward
  // (each layer's input and activations, the ids, the head's activations, logits and loss rows).
  static int64_t InFlightBytes(const ModelConfig& config, const ModelOptions& options, int tp_size);

  // inputs, targets: i32 [micro_batch, seq_len] (target -1: no loss for that position).
  // first_sample: global index of the micro-batch's first sample (keys its dropout masks).
  // Returns the sum of the token losses and the number of tokens that carry a loss.
  struct LossSum {
    double sum = 0.0;
    int64_t tokens = 0;
  };
  // Refuses a model that is not the whole model (a pipeline stage): use ForwardStage. Returns
  // this forward's loss (TakeLossSum after ForwardStage).
  absl::StatusOr<LossSum> Forward(const Tensor& inputs, const Tensor& targets,
                                  uint64_t first_sample, bool train);

  // Gradients of sum(token losses) * loss_weight, accumulated into params().grads(). The
  // caller passes loss_weight = loss_scale / (tokens in the global batch).
  absl::Status Backward(float loss_weight);

  // One micro-batch through this stage, its activations kept under the key `micro_batch` (any
  // int unique among the micro-batches in flight, e.g. its index in the step; a key already in
  // flight has its activations replaced, as evaluation forwards that see no backward need).
  // The first stage reads input_ids (i32 [micro_batch, seq_len]); the others read input_hidden
  // (hidden_shape(), model dtype). The last stage reads targets as Forward
  // does; the others ignore them. Inputs and targets are copied: the caller may reuse them.
  // Returns the output hidden state of a non-last stage (hidden_shape(), model dtype, owned by the
  // model, valid until the micro-batch's BackwardStage); the last stage returns nullptr and adds
  // the micro-batch's loss to the device-side totals that TakeLossSum reads.
  absl::StatusOr<const Tensor*> ForwardStage(int micro_batch, const Tensor* input_ids,
                                             const Tensor* input_hidden, const Tensor& targets,
                                             uint64_t first_sample, bool train);
  // The losses the last stage's forwards added since the last call, read from the device (one
  // host-device sync: the trainer calls it once per step, at the step's end), and reset. Zero
  // on other stages.
  absl::StatusOr<LossSum> TakeLossSum();
  // Reports, during a backward, that every parameter gradient at flat offsets >= `offset` of
  // params().grads() has received this micro-batch's contribution (the offsets fall as the
  // backward moves from the head to the embedding, and reach 0 at its end). On the last
  // micro-batch of a step those gradients are final: data parallelism starts reducing them.
  using GradsDoneFrom = std::function<absl::Status(int64_t offset)>;
  // Backward through micro-batch `micro_batch`, which must be in flight; its activations are
  // released. The last stage starts from the loss scaled by loss_weight (as Backward); the
  // others from output_grad, the gradient of their output hidden state (hidden_shape()).
  // Parameter gradients accumulate into params().grads(); a non-first stage leaves the gradient
  // of its input in input_grad().
  absl::Status BackwardStage(int micro_batch, const Tensor* output_grad, float loss_weight,
                             const GradsDoneFrom& grads_done_from = nullptr);
  // Drops the activations of a micro-batch that will see no backward (evaluation), returning
  // them to the pool; a no-op when it is not in flight.
  void DiscardForward(int micro_batch);
  // hidden_shape(): the gradient of the last BackwardStage's input hidden state (non-first stages),
  // valid until the next BackwardStage.
  const Tensor& input_grad() const { return grad_a_; }
  // ---- Incremental decoding (generation; model/normformer_kv_cache.cc). StartKvCache allocates
  // (or empties) a key/value cache per layer of this stage, [micro_batch, local heads, capacity,
  // head_dim] each, capacity <= max_seq_len. Each ForwardCached then runs the next seq_len tokens
  // of every sample at positions cached_tokens() + t: they attend everything cached before them
  // and join the cache. Inputs and output as ForwardStage's (no targets, no loss, no dropout):
  // the last stage's logits() holds their [micro_batch * seq_len, V_pad / tp] rows. Every stage
  // of a pipeline runs the same ForwardCached calls in the same order.
  absl::Status StartKvCache(int64_t capacity);
  absl::StatusOr<const Tensor*> ForwardCached(const Tensor* input_ids, const Tensor* input_hidden);
  int64_t cached_tokens() const { return cached_tokens_; }

  // Micro-batches forwarded and not yet backwarded, now and at most since creation.
  int in_flight() const { return static_cast<int>(in_flight_.size()); }
  int peak_in_flight() const { return peak_in_flight_; }

  // [Ts, d]: the hidden states this stage takes and returns (Ts = micro_batch * seq_len, or
  // this rank's 1 / tp of those rows with sequence parallelism).
  Shape hidden_shape() const { return {shape_.shard_tokens(), shape_.d_model}; }
  // The flat gradient ranges that sequence parallelism leaves partial on each tensor-parallel
  // rank: the replicated parameters (LayerNorms, row-parallel biases, NormFormer's replicated
  // scales, learned positions), whose gradients come from this rank's rows only. Each must be
  // summed over tp once per step; empty without sequence parallelism.
  std::vector<optim::FlatRange> SequenceParallelGradRanges() const;
  // Sums those ranges of params().grads() over tp (one coalesced all-reduce): for callers
  // without a data-parallel reduction (the trainer sums that reduction's output instead).
  absl::Status ReduceSequenceParallelGrads();
  // The resolved placement (layer_end set).
  const PipelineStagePlacement& placement() const { return options_.pipeline; }
  // Parameters whose gradients must be all-reduced over the embedding group (first and last
  // stages) before the optimizer step: see EmbeddingGroupParams.
  std::vector<std::string> embedding_group_params() const {
    return EmbeddingGroupParams(config_, options_.pipeline);
  }

  // This rank's share of the global squared gradient norm (ParamTable::OwnedSquaredGradNorm):
  // tensor-parallel duplicates count on tp rank 0, and a tied head copy on the last stage not at
  // all (the first stage counts the embedding). Call it after the embedding-group all-reduce,
  // which makes both copies' gradients the full one.
  absl::StatusOr<double> OwnedSquaredGradNorm() const;
  // Parameters this stage holds as a copy of another stage's: the last stage's tied head.
  std::vector<std::string> CopiesOfOtherStages() const;
  // The flat gradient ranges that share covers (ParamTable::OwnedNormRanges).
  std::vector<optim::FlatRange> OwnedNormRanges() const;
  // The same ranges grouped by block (BlockOf: kEmbeddingBlock, layer index, HeadBlock), for
  // per-block gradient norms.
  std::map<int, std::vector<optim::FlatRange>> OwnedNormRangesByBlock() const;

  ParamTable& params() { return table_; }
  const ParamTable& params() const { return table_; }
  const ModelParams& model_params() const { return params_; }
  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  int64_t padded_vocab() const { return padded_vocab_; }
  // This rank's vocabulary slice [vocab_offset(), vocab_offset() + padded_vocab() / tp).
  int64_t vocab_offset() const { return vocab_offset_; }
  parallel::Communicator& tensor_parallel() { return *tp_; }
  // [tokens, padded_vocab / tp] logits of this rank's vocabulary slice from the last forward of
  // the last stage (overwritten by its backward).
  const Tensor& logits() const { return last_forward_->logits; }

 private:
  // What one micro-batch keeps from its forward to its backward.
  struct InFlight {
    std::vector<Tensor> hidden;            // [Ts, d] x (stage layers + 1): each layer's input,
                                           // then the stage's output
    std::vector<LayerActivations> layers;  // one per layer; empty with full recompute
    Tensor ids, targets;                   // i32 [T] copies (first stage, last stage)
    // The last stage's head and loss.
    Tensor final_norm, final_mean, final_rstd;  // [Ts, d], [Ts], [Ts]
    // The masked LM's transform: the dense layer's output (the activation's input), the
    // LayerNorm's output (the projection's input) [Ts, d] and its statistics [Ts].
    Tensor head_dense, head_norm, head_mean, head_rstd;
    Tensor logits;               // [T, V_pad / tp]; dlogits after the backward
    Tensor row_max, token_loss;  // [T] fp32
    // [2, T] fp32: the sums of exponentials and target logits, all-reduced together.
    Tensor loss_sums, sum_exp, target_logit;
    DecoderLayer::Step step;
  };

  NormFormerModel(ModelConfig config, ModelOptions options,
                  std::unique_ptr<parallel::Communicator> own_tp, ParamTable table);
  // A zeroed tensor on the model's device.
  absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape) const {
    return ops::Zeros(dtype, std::move(shape), options_.device);
  }
  absl::Status AllocateBuffers();
  absl::StatusOr<std::unique_ptr<InFlight>> AllocateInFlight() const;
  // The activations for a new forward of `micro_batch`: its own if in flight, else pooled ones.
  absl::StatusOr<InFlight*> Acquire(int micro_batch);
  absl::Status CheckWholeModel(absl::string_view method) const;
  // targets: null when there are none (ForwardCached).
  absl::Status CheckStageInputs(const Tensor* input_ids, const Tensor* input_hidden,
                                const Tensor* targets) const;
  absl::Status CheckHiddenShape(absl::string_view what, const Tensor* hidden) const;
  // With use_kv_cache, each layer reads and extends its kv_caches_ entry.
  absl::Status LayersForward(InFlight& mb, bool use_kv_cache = false);
  absl::Status LayersBackward(InFlight& mb, const GradsDoneFrom& grads_done_from);
  absl::Status HeadForward(InFlight& mb);    // LogitsForward, then the loss
  absl::Status LogitsForward(InFlight& mb);  // the final LayerNorm and the LM head
  absl::Status HeadBackward(InFlight& mb, float loss_weight);
  // Token t of each sample sits at position first_token + t (0 except for ForwardCached).
  absl::Status EmbedForward(InFlight& mb, int64_t first_token = 0);
  absl::Status EmbedBackward(InFlight& mb);
  ops::DropoutSpec EmbeddingDropout(const DecoderLayer::Step& step) const;
  const Param& HeadWeight() const;  // the embedding when tied, else output_projection
  // [Ts, d]: what the projection reads, the final LayerNorm's output or the masked LM's
  // transform's.
  const Tensor& ProjectionInput(const InFlight& mb) const;
  bool masked_lm() const { return config_.objective() == ModelConfig::MASKED_LM; }
  ops::CrossEntropyArgs LossArgs(const InFlight& mb) const;
  // `layer` counts from the stage's first layer.
  LayerActivations& ActivationsOf(InFlight& mb, int layer) {
    return shares_activations() ? shared_acts_ : mb.layers[layer];
  }

  bool full_recompute() const { return options_.recompute == Recompute::kFull; }
  // One set of layer activations for every layer: the backward recomputes them, or there is no
  // backward.
  bool shares_activations() const { return full_recompute() || !options_.gradients; }

  ModelConfig config_;
  ModelOptions options_;
  std::unique_ptr<parallel::Communicator> own_tp_;  // the group of one, without tensor parallelism
  parallel::Communicator* tp_ = nullptr;
  TensorParallelRegion region_;
  ParamTable table_;
  ModelParams params_;
  int64_t padded_vocab_ = 0;
  int64_t vocab_offset_ = 0;
  LayerShape shape_;
  LayerOptions layer_options_;
  std::vector<DecoderLayer> layers_;  // the stage's layers
  // The lowest flat gradient offset of each stage layer's parameters, and of the head's (the
  // final LayerNorm and an untied projection): what GradsDoneFrom reports after each.
  std::vector<int64_t> layer_grad_offsets_;
  int64_t head_grad_offset_ = 0;

  absl::flat_hash_map<int, std::unique_ptr<InFlight>> in_flight_;  // by micro-batch key
  std::vector<std::unique_ptr<InFlight>> pool_;  // released, reused by later forwards
  int peak_in_flight_ = 0;
  const InFlight* last_forward_ = nullptr;  // of the last stage, for logits()

  // Buffers shared by all micro-batches, allocated once.
  LayerActivations shared_acts_;  // every layer's, with full recompute
  LayerScratch scratch_;
  Tensor positions_;        // the first stage's sinusoidal [max_seq_len, d] (row t: t + first)
  Tensor dloss_;            // the last stage's [T] fp32 loss weights
  Tensor loss_totals_;      // the last stage's f64 [2]: loss sum and tokens, until TakeLossSum
  Tensor grad_a_, grad_b_;  // [Ts, d] residual-stream gradients

  std::vector<LayerKvCache> kv_caches_;  // per stage layer, after StartKvCache
  int64_t cached_tokens_ = 0;            // per sample, in every cache
};

}  // namespace nf::model
