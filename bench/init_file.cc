// nf-bench-init-file: a model of any size as one safetensors file with fairseq's names (what
// `nf-ckpt export --format fairseq` writes and `nf-ckpt import` reads), holding the parameters a
// fresh run with that seed initialises (model::InitialValues), written tensor by tensor: the
// starting point of bench/checkpoint_2p7b.sh, which needs a real 2.7B checkpoint on a machine
// that cannot train one.
//
//   build/bench/nf-bench-init-file --config RUN.pbtxt [--set PATH=VALUE]... --out FILE
//                                  [--dtype f16|bf16|f32] [--seed N]
//
// The dtype defaults to f16 (the 2.7B's training precision); the seed to the config's
// train.seed. Memory: one parameter's fp32 values and their converted copy (the embedding's:
// 0.8 GB at 2.7B in f16).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "checkpoint/fairseq_model.h"
#include "checkpoint/output_path.h"
#include "checkpoint/safetensors_file.h"
#include "core/status.h"
#include "launcher/config.h"
#include "model/normformer_params.h"
#include "model/param_table.h"

namespace nf {
namespace {

// The initial values of `spec`, drawn on every core.
std::vector<float> DrawParallel(const model::ParamSpec& spec, uint32_t seed) {
  const int64_t numel = NumElements(spec.global_shape);
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1,
                                              std::max<int64_t>(numel / (1 << 16), 1));
  std::vector<float> values(static_cast<size_t>(numel));
  std::vector<std::thread> workers;
  for (int64_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const int64_t begin = numel * t / threads, end = numel * (t + 1) / threads;
      const std::vector<float> part = model::InitialValues(spec, seed, begin, end - begin);
      std::copy(part.begin(), part.end(), values.begin() + begin);
    });
  }
  for (std::thread& w : workers) w.join();
  return values;
}

absl::Status WriteInitFile(const launcher::TrainConfig& config, DType dtype, uint32_t seed,
                           const std::string& out) {
  NF_RETURN_IF_ERROR(checkpoint::CheckNewOutput(out, "--out", "the file is written new"));
  const model::ModelConfig& model = config.model();
  NF_RETURN_IF_ERROR(checkpoint::CheckFairseqRepresents(model));
  // The real vocabulary's rows, as fairseq files hold them.
  const std::vector<model::ParamSpec> specs =
      model::NormFormerParamSpecs(model, model.vocab_size());
  std::vector<checkpoint::SafetensorsEntry> entries = {
      {.name = checkpoint::kFairseqVersionTensor, .dtype = DType::kF32, .shape = {1}}};
  for (const model::ParamSpec& spec : specs) {
    entries.push_back({.name = spec.name, .dtype = dtype, .shape = spec.global_shape});
  }
  NF_ASSIGN_OR_RETURN(checkpoint::SafetensorsWriter writer,
                      checkpoint::SafetensorsWriter::Create(
                          out, checkpoint::FairseqExportMetadata(model, 0), std::move(entries)));
  NF_ASSIGN_OR_RETURN(
      const Tensor version,
      TensorFromFloats(DType::kF32, {1}, std::vector<float>{checkpoint::kFairseqDecoderVersion}));
  NF_RETURN_IF_ERROR(writer.Append(version));
  for (const model::ParamSpec& spec : specs) {
    const std::vector<float> values = DrawParallel(spec, seed);
    NF_ASSIGN_OR_RETURN(const Tensor data,
                        TensorFromFloats(dtype, {static_cast<int64_t>(values.size())}, values));
    NF_RETURN_IF_ERROR(writer.Append(data));
  }
  return writer.Commit();
}

int Usage(const char* message) {
  std::fprintf(stderr,
               "nf-bench-init-file: %s\nusage: nf-bench-init-file --config RUN.pbtxt "
               "[--set PATH=VALUE]... --out FILE [--dtype f16|bf16|f32] [--seed N]\n",
               message);
  return 2;
}

int Main(int argc, char** argv) {
  std::string config_path, out, dtype_name = "f16";
  std::vector<std::string> overrides;
  int64_t seed = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return Usage(("incomplete argument " + arg).c_str());
    const std::string value = argv[++i];
    if (arg == "--config") {
      config_path = value;
    } else if (arg == "--set") {
      overrides.push_back(value);
    } else if (arg == "--out") {
      out = value;
    } else if (arg == "--dtype") {
      dtype_name = value;
    } else if (arg == "--seed") {
      if (!absl::SimpleAtoi(value, &seed) || seed < 0 || seed > UINT32_MAX) {
        return Usage("--seed takes an integer in [0, 2^32)");
      }
    } else {
      return Usage(("unknown argument " + arg).c_str());
    }
  }
  if (config_path.empty() || out.empty()) return Usage("--config and --out are required");
  const absl::StatusOr<DType> dtype = ParseDType(dtype_name);
  if (!dtype.ok()) return Usage(std::string(dtype.status().message()).c_str());
  const absl::StatusOr<launcher::TrainConfig> config =
      launcher::LoadTrainConfig(config_path, overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "nf-bench-init-file: %s\n",
                 std::string(config.status().message()).c_str());
    return 1;
  }
  const uint32_t drawn_seed =
      static_cast<uint32_t>(seed >= 0 ? seed : static_cast<int64_t>(config->train().seed()));
  const absl::Status written = WriteInitFile(*config, *dtype, drawn_seed, out);
  if (!written.ok()) {
    std::fprintf(stderr, "nf-bench-init-file: %s\n", std::string(written.message()).c_str());
    return 1;
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace
}  // namespace nf

int main(int argc, char** argv) { return nf::Main(argc, argv); }
