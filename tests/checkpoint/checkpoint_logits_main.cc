// checkpoint_logits: the project's own logits of a checkpoint, for tests that compare them with
// another implementation (tests/checkpoint/fairseq_interop_test.py).
//
//   checkpoint_logits CHECKPOINT_DIR TOKENS.txt OUT.npy [TARGETS.txt]
//
// CHECKPOINT_DIR may be a run's checkpoints directory, meaning the checkpoint `latest` names.
//
// Loads the checkpoint's parameters (any layout: each tensor reassembled, then cut for one
// rank) into an fp32 model on one CPU rank, runs the forward of every line of TOKENS.txt (token
// ids separated by spaces, every line the same length, at most model.max_seq_len) without
// dropout, and writes the logits of the real vocabulary as a float32 .npy array
// [sequences, length, vocab_size]. Any model: a causal LM's logits at token t predict token
// t + 1, a masked LM's (model.objective MASKED_LM) the token at t.
//
// With TARGETS.txt (lines as TOKENS.txt's; -1: no target there) the forward's own loss comes
// too, as the model computes it in training: "loss_sum S tokens N" on stdout, S the sum of the
// token losses (%.17g) and N the number of targets.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/assemble.h"
#include "checkpoint/load.h"
#include "core/ops/ops.h"
#include "core/status.h"
#include "model/normformer_model.h"

namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::vector<std::vector<int32_t>>> ReadTokens(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::vector<std::vector<int32_t>> lines;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::vector<int32_t> ids;
    for (int32_t id; words >> id;) ids.push_back(id);
    if (ids.empty()) continue;
    if (!lines.empty() && ids.size() != lines.front().size()) {
      return absl::InvalidArgumentError("every line of tokens must have the same length");
    }
    lines.push_back(std::move(ids));
  }
  if (lines.empty()) return absl::InvalidArgumentError("no tokens");
  return lines;
}

// numpy's .npy format 1.0: magic, header length, a Python dict literal padded to 64 bytes.
absl::Status WriteNpy(const fs::path& path, const std::vector<float>& values, int64_t a, int64_t b,
                      int64_t c) {
  std::string header = absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (", a, ", ",
                                    b, ", ", c, "), }");
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t length = static_cast<uint16_t>(header.size());
  out.put(static_cast<char>(length & 0xFF));
  out.put(static_cast<char>(length >> 8));
  out << header;
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(float)));
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

absl::Status Run(fs::path dir, const fs::path& tokens_path, const fs::path& out,
                 const std::optional<fs::path>& targets_path) {
  if (fs::exists(dir / "latest")) {  // a run's checkpoints directory: the checkpoint it names
    NF_ASSIGN_OR_RETURN(dir, nf::checkpoint::LatestCheckpoint(dir));
  }
  NF_ASSIGN_OR_RETURN(const nf::checkpoint::Manifest manifest, nf::checkpoint::ReadManifest(dir));
  NF_ASSIGN_OR_RETURN(const auto lines, ReadTokens(tokens_path));
  const int64_t n = static_cast<int64_t>(lines.size());
  const int64_t seq = static_cast<int64_t>(lines.front().size());
  NF_ASSIGN_OR_RETURN(
      auto model,
      nf::model::NormFormerModel::Create(
          manifest.model(), {.dtype = nf::DType::kF32, .micro_batch = n, .seq_len = seq}));
  std::map<std::string, const nf::checkpoint::TensorRecord*> params;
  for (const auto& r : manifest.tensors()) {
    if (r.kind() == nf::checkpoint::TensorRecord::PARAM) params[r.name()] = &r;
  }
  for (const nf::model::ParamTable::Entry& e : model->params().entries()) {
    if (!params.count(e.spec.name)) {
      return absl::NotFoundError(absl::StrCat("the checkpoint has no ", e.spec.name));
    }
    NF_ASSIGN_OR_RETURN(const auto whole,
                        nf::checkpoint::AssembleTensor(dir, manifest, *params[e.spec.name]));
    NF_ASSIGN_OR_RETURN(const nf::Tensor shard,
                        nf::checkpoint::CutShard(dir, whole, e.spec, e.value.numel(), 0, 1));
    NF_ASSIGN_OR_RETURN(const nf::Tensor target, e.value.Reshape({e.value.numel()}));
    NF_RETURN_IF_ERROR(nf::ops::Cast(shard, target));
  }
  std::vector<int32_t> ids, targets(n * seq, -1);
  for (const auto& line : lines) ids.insert(ids.end(), line.begin(), line.end());
  if (targets_path) {
    NF_ASSIGN_OR_RETURN(const auto target_lines, ReadTokens(*targets_path));
    if (static_cast<int64_t>(target_lines.size()) != n ||
        target_lines.front().size() != lines.front().size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          targets_path->string(), " must have the tokens' ", n, " lines of ", seq, " targets"));
    }
    targets.clear();
    for (const auto& line : target_lines) targets.insert(targets.end(), line.begin(), line.end());
  }
  NF_ASSIGN_OR_RETURN(const nf::Tensor inputs, nf::Tensor::HostZeros(nf::DType::kI32, {n, seq}));
  NF_ASSIGN_OR_RETURN(const nf::Tensor target_ids,
                      nf::Tensor::HostZeros(nf::DType::kI32, {n, seq}));
  std::copy(ids.begin(), ids.end(), inputs.data<int32_t>());
  std::copy(targets.begin(), targets.end(), target_ids.data<int32_t>());
  NF_ASSIGN_OR_RETURN(const nf::model::NormFormerModel::LossSum loss,
                      model->Forward(inputs, target_ids, 0, /*train=*/false));
  if (targets_path) {
    std::printf("loss_sum %.17g tokens %lld\n", loss.sum, static_cast<long long>(loss.tokens));
  }
  NF_ASSIGN_OR_RETURN(const std::vector<float> padded, nf::ToFloatVector(model->logits()));
  const int64_t vocab = manifest.model().vocab_size(), width = model->padded_vocab();
  std::vector<float> logits;
  for (int64_t row = 0; row < n * seq; ++row) {
    logits.insert(logits.end(), padded.begin() + row * width, padded.begin() + row * width + vocab);
  }
  return WriteNpy(out, logits, n, seq, vocab);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::cerr << "usage: checkpoint_logits CHECKPOINT_DIR TOKENS.txt OUT.npy [TARGETS.txt]\n";
    return 2;
  }
  const absl::Status status =
      Run(argv[1], argv[2], argv[3], argc == 5 ? std::optional<fs::path>(argv[4]) : std::nullopt);
  if (!status.ok()) {
    std::cerr << "checkpoint_logits: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
