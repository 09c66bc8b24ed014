#include "model/model_config_check.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/range_checks.h"
#include "core/status.h"

namespace nf::model {
namespace {

// Far above any published model (the largest dense ones have ~120 layers, d_model ~25k, ffn
// ~100k, vocabularies ~256k, contexts ~1M), far below what overflows an int32 index or an int64
// byte count when multiplied together.
constexpr int32_t kMaxLayers = 4096;
constexpr int32_t kMaxWidth = 1 << 20;  // d_model, num_heads
constexpr int32_t kMaxFfn = 1 << 22;
constexpr int32_t kMaxVocab = 1 << 24;
constexpr int32_t kMaxSeqLen = 1 << 22;
constexpr int32_t kMaxFirstPosition = 1 << 10;
constexpr char kBeyondAnyModel[] = "beyond any real model: a corrupt or mistyped value";

}  // namespace

absl::Status ValidateModelConfig(const ModelConfig& model) {
  NF_RETURN_IF_ERROR(
      RequireInRange("model.num_layers", model.num_layers(), kMaxLayers, kBeyondAnyModel));
  NF_RETURN_IF_ERROR(RequireInRange("model.d_model", model.d_model(), kMaxWidth, kBeyondAnyModel));
  NF_RETURN_IF_ERROR(
      RequireInRange("model.num_heads", model.num_heads(), kMaxWidth, kBeyondAnyModel));
  NF_RETURN_IF_ERROR(RequireInRange("model.ffn_dim", model.ffn_dim(), kMaxFfn, kBeyondAnyModel));
  NF_RETURN_IF_ERROR(
      RequireInRange("model.vocab_size", model.vocab_size(), kMaxVocab, kBeyondAnyModel));
  NF_RETURN_IF_ERROR(
      RequireInRange("model.max_seq_len", model.max_seq_len(), kMaxSeqLen, kBeyondAnyModel));
  NF_RETURN_IF_ERROR(RequireNonNegative("model.first_position", model.first_position()));
  if (model.first_position() > kMaxFirstPosition) {
    return absl::InvalidArgumentError(absl::StrCat("model.first_position must be at most ",
                                                   kMaxFirstPosition, " (got ",
                                                   model.first_position(), ")"));
  }
  if (model.d_model() % model.num_heads() != 0) {
    const int64_t up = (int64_t{model.d_model()} / model.num_heads() + 1) * model.num_heads();
    return absl::InvalidArgumentError(absl::StrCat(
        "model.d_model (", model.d_model(), ") must be a multiple of model.num_heads (",
        model.num_heads(), "): e.g. model.d_model=", up, ", or a num_heads that divides ",
        model.d_model()));
  }
  // -1 stands for the last id; checked whatever the objective, like the dropouts below.
  if (model.mask_token() < -1 || model.mask_token() >= model.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.mask_token (", model.mask_token(), ") must be in [-1, model.vocab_size) = [-1, ",
        model.vocab_size(), "); -1 is the last id, vocab_size - 1"));
  }
  if (model.objective() == ModelConfig::MASKED_LM && model.vocab_size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.objective MASKED_LM needs model.vocab_size >= 2 (got ",
                     model.vocab_size(), "): <mask> and a token to replace it with"));
  }
  NF_RETURN_IF_ERROR(RequireUnitInterval("model.dropout", model.dropout()));
  NF_RETURN_IF_ERROR(RequireUnitInterval("model.attention_dropout", model.attention_dropout()));
  NF_RETURN_IF_ERROR(RequireUnitInterval("model.activation_dropout", model.activation_dropout()));
  return RequirePositive("model.layer_norm_eps", model.layer_norm_eps());
}

absl::Status RequireCausalLm(const ModelConfig& model, absl::string_view what) {
  if (model.objective() != ModelConfig::MASKED_LM) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(what,
                   " needs a causal LM, and this model is a masked LM (model.objective "
                   "MASKED_LM: a bidirectional encoder that predicts masked tokens)"));
}

}  // namespace nf::model
