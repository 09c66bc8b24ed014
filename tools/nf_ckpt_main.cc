// nf-ckpt: looks into, verifies and exports normformer checkpoints without training.
//
//   nf-ckpt inspect DIR [--tensors]
//   nf-ckpt verify DIR
//   nf-ckpt export DIR --format safetensors|fairseq --out FILE [--dtype f32|f16|bf16]
//   nf-ckpt export DIR --format hf --out DIR [--dtype ...] [--model-type auto|normformer|gpt2]
//           [--max-shard-size BYTES] [--tokenizer gpt2 --vocab-file F --merges-file F |
//            --tokenizer sentencepiece --spm-model F]
//   nf-ckpt import FILE --out OUT [--tp N --pp N --dp N --virtual N --zero1
//           --bucket-elements N] [--config RUN.pbtxt [--set PATH=VALUE]...] [--step N]
//   nf-ckpt import HF_DIR --out OUT [--tp N ... as above] [--step N]
//   nf-ckpt convert DIR --tp N --pp N --dp N [--virtual N] [--zero1] [--bucket-elements N]
//           --out OUT
//
// DIR is a checkpoint (RUN/checkpoints/iter_NNNNNNN) or a run's checkpoints directory, which
// means the checkpoint its `latest` names. Exit codes: 0 done, 1 a bad or unreadable
// checkpoint, 2 bad command line.
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/assemble.h"
#include "checkpoint/convert.h"
#include "checkpoint/fairseq_export.h"
#include "checkpoint/fairseq_import.h"
#include "checkpoint/hf_export.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/load.h"
#include "checkpoint/piece_reader.h"
#include "checkpoint/safetensors_export.h"
#include "checkpoint/save.h"
#include "core/half.h"
#include "core/status.h"
#include "launcher/config.h"

namespace {

namespace fs = std::filesystem;
using nf::checkpoint::Manifest;
using nf::checkpoint::TensorRecord;

constexpr char kUsage[] = R"(usage: nf-ckpt COMMAND DIR [options]

Looks into normformer checkpoints. DIR is a checkpoint directory (RUN/checkpoints/iter_NNNNNNN)
or a checkpoints directory, meaning the checkpoint its `latest` file names.

commands:
  inspect DIR [--tensors]   step, layout, files and sizes; with --tensors one line per
                            parameter: name, global shape, dtype, sum and sum of squares
  verify DIR                the manifest's checksum, then every piece of every tensor:
                            checksums, bounds, coverage, finite values (each bad one named)
  export DIR --format safetensors --out FILE [--dtype f32|f16|bf16]
                            the parameters as they are, one safetensors file (fairseq names,
                            the vocabulary tables cut to the real vocabulary)
  export DIR --format fairseq --out FILE [--dtype f32|f16|bf16]
                            a file fairseq's transformer_lm loads and runs to this model's
                            logits: decoder.version, a BEFORE_OUT_PROJ head scale folded into
                            out_proj, the model config and fairseq flags in its metadata;
                            a masked LM as fairseq's RoBERTa (Pre-LN encoder; its arguments
                            in the metadata); refuses what fairseq cannot represent, naming
                            the field
  export DIR --format hf --out DIR [--dtype f32|f16|bf16] [--model-type auto|normformer|gpt2]
         [--max-shard-size BYTES] [--tokenizer gpt2 --vocab-file vocab.json
         --merges-file merges.txt | --tokenizer sentencepiece --spm-model FILE]
                            a new directory that Hugging Face transformers loads
                            (AutoModelForCausalLM, trust_remote_code=True, and AutoTokenizer):
                            config.json, model.safetensors (sharded with an index above
                            --max-shard-size, default 50000000000), the model's Python files,
                            the tokenizer's files; --model-type auto (default) writes a plain
                            GPT-2 (no remote code) when GPT-2 computes the model exactly
  import FILE --out OUT [--tp N --pp N --dp N --virtual N --zero1 --bucket-elements N]
         [--config RUN.pbtxt [--set PATH=VALUE]...] [--step N]
                            a safetensors file with fairseq names (the fairseq export, or
                            scripts/fairseq-pt-to-safetensors.py's) as a checkpoint for that
                            layout (default 1 x 1 x 1) with a fresh optimizer; the model
                            config from the file's metadata, else from --config's model
                            section; the step from the file's metadata unless --step
  import HF_DIR --out OUT [--tp N --pp N --dp N --virtual N --zero1 --bucket-elements N]
         [--step N]
                            a Hugging Face model directory (export --format hf's, or a GPT-2
                            that transformers saved) the same way: the model from its
                            config.json, the weights from model.safetensors or the shards its
                            index names; pickles (*.bin, *.pt) are never loaded and no .py is
                            run; the step from the weights' metadata unless --step, else 0
  convert DIR --tp N --pp N --dp N [--virtual N] [--zero1] [--bucket-elements N] --out OUT
                            the checkpoint rewritten for another layout: one shard file per
                            rank of it, as a run on that layout would write (any layout loads
                            any checkpoint anyway; converted, each rank reads only its file)

exit codes: 0 done, 1 bad or unreadable checkpoint, 2 bad command line
)";

int UsageError(const std::string& message) {
  std::cerr << "nf-ckpt: " << message << "\n(run nf-ckpt --help for usage)\n";
  return 2;
}

int Fail(const absl::Status& status) {
  std::cerr << "nf-ckpt: " << status.message() << "\n";
  return 1;
}

// A checkpoint directory, or the one a checkpoints directory's `latest` names.
absl::StatusOr<fs::path> Resolve(const fs::path& dir) {
  const fs::path latest = dir / nf::checkpoint::kLatestName;
  std::error_code error;
  if (fs::exists(latest, error)) return nf::checkpoint::LatestCheckpoint(dir);
  if (error) {  // a name too long, a loop of symbolic links: said, not thrown
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", latest.string(), ": ", error.message()));
  }
  return dir;
}

struct Moments {
  double sum = 0, squares = 0;
};

// The sum and the sum of squares of a host tensor's values in double, in four interleaved lanes
// (element i in lane i % 4, the lanes added at the end): the same figures for the same global
// tensor whatever layout wrote it, four independent additions at a time instead of one chain.
// fp16 is widened through a table of its 65,536 values (the branchy bit conversion was most of
// inspect's time).
template <typename T, typename Widen>
Moments LaneSums(const T* data, int64_t n, Widen widen) {
  double sum[4] = {0, 0, 0, 0}, squares[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) {
    const double v = widen(data[i]);
    sum[i % 4] += v;
    squares[i % 4] += v * v;
  }
  return {.sum = (sum[0] + sum[1]) + (sum[2] + sum[3]),
          .squares = (squares[0] + squares[1]) + (squares[2] + squares[3])};
}

Moments SumAndSquares(const nf::Tensor& t) {
  static const std::vector<float> kHalfValues = [] {
    std::vector<float> values(1 << 16);
    for (uint32_t bits = 0; bits < values.size(); ++bits) {
      values[bits] = nf::HalfBitsToFloat(static_cast<uint16_t>(bits));
    }
    return values;
  }();
  switch (t.dtype()) {
    case nf::DType::kF16:
      return LaneSums(t.data<nf::Half>(), t.numel(),
                      [](nf::Half h) { return kHalfValues[h.bits]; });
    case nf::DType::kBF16:
      return LaneSums(t.data<nf::BFloat16>(), t.numel(),
                      [](nf::BFloat16 b) { return nf::ToFloat(b); });
    default:
      return LaneSums(t.data<float>(), t.numel(), [](float f) { return f; });
  }
}

absl::Status Inspect(const fs::path& dir, const Manifest& m, bool tensors) {
  const nf::checkpoint::Layout& layout = m.layout();
  int64_t bytes = 0;
  for (const auto& f : m.files()) bytes += f.size();
  std::cout << absl::StrFormat(
      "checkpoint %s\n  format %d, step %d, %d samples consumed of a data stream of %d, %d "
      "optimizer updates\n"
      "  written by tensor_parallel %d x pipeline_parallel %d x data_parallel %d "
      "(virtual stages %d%s)\n  model: %d layers, d_model %d, %d heads, ffn %d, vocab %d\n"
      "  %d shard files, %d bytes; %d tensor records\n",
      dir.string(), m.format_version(), m.step(), m.consumed_samples(), m.data_stream_samples(),
      m.optimizer_updates(), layout.tensor_parallel(), layout.pipeline_parallel(),
      layout.data_parallel(), layout.virtual_stages(),
      layout.distributed_optimizer() ? ", ZeRO-1" : "", m.model().num_layers(), m.model().d_model(),
      m.model().num_heads(), m.model().ffn_dim(), m.model().vocab_size(), m.files_size(), bytes,
      m.tensors_size());
  if (m.has_loss_scaler()) std::cout << "  loss scale " << m.loss_scaler().scale() << "\n";
  if (!tensors) return absl::OkStatus();
  std::vector<const TensorRecord*> params;
  for (const TensorRecord& r : m.tensors()) {
    if (r.kind() == TensorRecord::PARAM) params.push_back(&r);
  }
  nf::checkpoint::ShardReader hints(dir);
  for (size_t i = 0; i < params.size(); ++i) {
    // The disk reads the next parameter's pieces while this one is summed.
    if (i + 1 < params.size()) {
      for (const nf::checkpoint::Piece& p : params[i + 1]->pieces()) {
        hints.ReadAhead(p.file(), p.offset(), p.length());
      }
    }
    const TensorRecord& r = *params[i];
    NF_ASSIGN_OR_RETURN(const nf::checkpoint::AssembledTensor a,
                        nf::checkpoint::AssembleTensor(dir, m, r));
    const Moments moments = SumAndSquares(a.global);
    std::cout << absl::StrFormat("%s [%s] %s sum %.17g sumsq %.17g\n", r.name(),
                                 absl::StrJoin(a.shape, ", "), r.dtype(), moments.sum,
                                 moments.squares);
  }
  return absl::OkStatus();
}

// Every record, not only up to the first bad one: each failure (a checksum, a non-finite value,
// a gap) is one line on stderr naming the tensor, and the command fails if there was any. One
// block of a piece is in memory at a time.
absl::Status Verify(const fs::path& dir, const Manifest& m) {
  nf::checkpoint::ShardReader reader(dir);
  int64_t elements = 0;
  int failed = 0;
  for (const TensorRecord& r : m.tensors()) {
    const absl::StatusOr<int64_t> verified = nf::checkpoint::VerifyRecord(reader, m, r);
    if (verified.ok()) {
      elements += *verified;
    } else {
      ++failed;
      std::cerr << "nf-ckpt: " << verified.status().message() << "\n";
    }
  }
  if (failed > 0) {
    return absl::DataLossError(absl::StrFormat("%s: %d of %d tensor records fail (listed above)",
                                               dir.string(), failed, m.tensors_size()));
  }
  std::cout << absl::StrFormat(
      "%s: OK, manifest checksum and %d tensor records (%d elements, all "
      "finite) verified\n",
      dir.string(), m.tensors_size(), elements);
  return absl::OkStatus();
}

// nf-ckpt import: a Hugging Face directory, whose model is its config.json, or a fairseq file,
// whose model is its metadata's, or --config's model section (with --set overrides) for a file
// without one.
int Import(const std::string& source, std::map<std::string, std::string>& options,
           const std::vector<std::string>& overrides, const nf::checkpoint::TargetLayout& layout) {
  std::optional<int64_t> step;
  if (!options["--step"].empty()) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(options["--step"], &value) || value < 0) {
      return UsageError("--step takes an integer >= 0");
    }
    step = value;
  }
  if (!overrides.empty() && options["--config"].empty()) return UsageError("--set needs --config");
  std::error_code error;
  absl::Status status;
  if (fs::is_directory(source, error)) {
    if (!options["--config"].empty()) {
      return UsageError(
          "--config is for a fairseq file without a model config; a Hugging Face directory's "
          "model is its config.json");
    }
    status = nf::checkpoint::ImportHfDirectory(source, {.step = step, .layout = layout},
                                               options["--out"]);
  } else {
    nf::checkpoint::ImportOptions import{.model = std::nullopt, .step = step, .layout = layout};
    if (!options["--config"].empty()) {
      const auto config = nf::launcher::LoadTrainConfig(options["--config"], overrides);
      if (!config.ok()) return UsageError(std::string(config.status().message()));
      import.model = config->model();
    }
    status = nf::checkpoint::ImportFairseqSafetensors(source, import, options["--out"]);
  }
  if (!status.ok()) return Fail(status);
  std::cout << "wrote " << options["--out"] << "\n";
  return 0;
}

// export --format hf's own flags.
absl::Status ParseHfExportOptions(std::map<std::string, std::string>& options,
                                  std::optional<nf::DType> dtype,
                                  nf::checkpoint::HfExportOptions& hf) {
  hf.dtype = dtype;
  const std::string& type = options["--model-type"];
  if (type == "normformer") {
    hf.model_type = nf::checkpoint::HfModelType::kNormFormer;
  } else if (type == "gpt2") {
    hf.model_type = nf::checkpoint::HfModelType::kGpt2;
  } else if (!type.empty() && type != "auto") {
    return absl::InvalidArgumentError("--model-type takes auto, normformer or gpt2");
  }
  if (!options["--max-shard-size"].empty() &&
      (!absl::SimpleAtoi(options["--max-shard-size"], &hf.max_shard_bytes) ||
       hf.max_shard_bytes < 1)) {
    return absl::InvalidArgumentError("--max-shard-size takes a number of bytes >= 1");
  }
  using Kind = nf::checkpoint::HfTokenizerFiles::Kind;
  const std::string& tokenizer = options["--tokenizer"];
  const bool bpe_files = !options["--vocab-file"].empty() || !options["--merges-file"].empty();
  const bool spm_file = !options["--spm-model"].empty();
  if (tokenizer == "gpt2") {
    if (options["--vocab-file"].empty() || options["--merges-file"].empty() || spm_file) {
      return absl::InvalidArgumentError(
          "--tokenizer gpt2 takes --vocab-file and --merges-file (and no --spm-model)");
    }
    hf.tokenizer = {.kind = Kind::kGpt2,
                    .vocab_file = options["--vocab-file"],
                    .merges_file = options["--merges-file"],
                    .spm_model = {}};
  } else if (tokenizer == "sentencepiece") {
    if (!spm_file || bpe_files) {
      return absl::InvalidArgumentError(
          "--tokenizer sentencepiece takes --spm-model (and no --vocab-file or --merges-file)");
    }
    hf.tokenizer = {.kind = Kind::kSentencePiece,
                    .vocab_file = {},
                    .merges_file = {},
                    .spm_model = options["--spm-model"]};
  } else if (!tokenizer.empty()) {
    return absl::InvalidArgumentError("--tokenizer takes gpt2 or sentencepiece");
  } else if (bpe_files || spm_file) {
    return absl::InvalidArgumentError(
        "--vocab-file, --merges-file and --spm-model need --tokenizer");
  }
  return absl::OkStatus();
}

int Run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    }
  }
  if (args.size() < 2) return UsageError("a command and a checkpoint directory are required");
  const std::string command = args[0];
  std::map<std::string, std::string> options;
  std::vector<std::string> overrides;  // import's --set, in order
  bool tensors = false, zero1 = false;
  for (size_t i = 2; i < args.size(); ++i) {
    const bool valued =
        args[i] == "--format" || args[i] == "--out" || args[i] == "--dtype" || args[i] == "--tp" ||
        args[i] == "--pp" || args[i] == "--dp" || args[i] == "--virtual" ||
        args[i] == "--bucket-elements" || args[i] == "--config" || args[i] == "--step" ||
        args[i] == "--model-type" || args[i] == "--max-shard-size" || args[i] == "--tokenizer" ||
        args[i] == "--vocab-file" || args[i] == "--merges-file" || args[i] == "--spm-model";
    if (args[i] == "--tensors") {
      tensors = true;
    } else if (args[i] == "--zero1") {
      zero1 = true;
    } else if (args[i] == "--set" && i + 1 < args.size()) {
      overrides.push_back(args[++i]);
    } else if (valued && i + 1 < args.size()) {
      options[args[i]] = args[i + 1];
      ++i;
    } else {
      return UsageError("unknown or incomplete argument '" + args[i] + "'");
    }
  }
  if (command != "inspect" && command != "verify" && command != "export" && command != "convert" &&
      command != "import") {
    return UsageError("unknown command '" + command +
                      "' (inspect, verify, export, convert, import)");
  }
  nf::checkpoint::TargetLayout target;
  if (command == "convert" || command == "import") {
    const auto number = [&](const std::string& flag, int64_t fallback) -> std::optional<int64_t> {
      if (options[flag].empty()) return fallback;
      int64_t value = 0;
      if (!absl::SimpleAtoi(options[flag], &value) || value < 1) return std::nullopt;
      return value;
    };
    for (const char* flag : {"--tp", "--pp", "--dp"}) {
      if (command == "convert" && options[flag].empty()) {
        return UsageError(std::string("convert needs ") + flag);
      }
    }
    const auto tp = number("--tp", 1), pp = number("--pp", 1), dp = number("--dp", 1);
    const auto v = number("--virtual", 1);
    const auto bucket = number("--bucket-elements", target.grad_bucket_elements);
    if (!tp || !pp || !dp || !v || !bucket) {
      return UsageError("--tp, --pp, --dp, --virtual and --bucket-elements take integers >= 1");
    }
    if (options["--out"].empty()) return UsageError(command + " needs --out DIR");
    target = {.tensor_parallel = static_cast<int>(*tp),
              .pipeline_parallel = static_cast<int>(*pp),
              .data_parallel = static_cast<int>(*dp),
              .virtual_stages = static_cast<int>(*v),
              .distributed_optimizer = zero1,
              .grad_bucket_elements = *bucket};
  }
  std::optional<nf::DType> dtype;
  nf::checkpoint::HfExportOptions hf;
  if (command == "export") {
    const std::string& format = options["--format"];
    if (format != "safetensors" && format != "fairseq" && format != "hf") {
      return UsageError("export needs --format safetensors, fairseq or hf");
    }
    if (options["--out"].empty()) return UsageError("export needs --out FILE");
    if (!options["--dtype"].empty()) {
      const auto parsed = nf::ParseDType(options["--dtype"]);
      if (!parsed.ok()) return UsageError(std::string(parsed.status().message()));
      dtype = *parsed;
    }
    if (format == "hf") {
      const absl::Status parsed = ParseHfExportOptions(options, dtype, hf);
      if (!parsed.ok()) return UsageError(std::string(parsed.message()));
    } else {
      for (const char* flag : {"--model-type", "--max-shard-size", "--tokenizer", "--vocab-file",
                               "--merges-file", "--spm-model"}) {
        if (!options[flag].empty()) return UsageError(std::string(flag) + " is for --format hf");
      }
    }
  }
  if (command == "import") return Import(args[1], options, overrides, target);
  const auto dir = Resolve(args[1]);
  if (!dir.ok()) return Fail(dir.status());
  const auto manifest = nf::checkpoint::ReadManifest(*dir);
  if (!manifest.ok()) return Fail(manifest.status());
  absl::Status status;
  if (command == "inspect") status = Inspect(*dir, *manifest, tensors);
  if (command == "verify") status = Verify(*dir, *manifest);
  if (command == "export") {
    const std::string& format = options["--format"];
    if (format == "hf") {
      status = nf::checkpoint::ExportHf(*dir, *manifest, options["--out"], hf);
    } else if (format == "fairseq") {
      status = nf::checkpoint::ExportFairseqSafetensors(*dir, *manifest, options["--out"], dtype);
    } else {
      status = nf::checkpoint::ExportSafetensors(*dir, *manifest, options["--out"], dtype);
    }
    if (status.ok()) std::cout << "wrote " << options["--out"] << "\n";
  }
  if (command == "convert") {
    status = nf::checkpoint::ConvertCheckpoint(*dir, *manifest, target, options["--out"]);
    if (status.ok()) std::cout << "wrote " << options["--out"] << "\n";
  }
  return status.ok() ? 0 : Fail(status);
}

}  // namespace

// The last line of defence: an exception where no status was expected (std::bad_alloc on a
// checkpoint too big for this machine's memory) ends nf-ckpt with one line and exit 1, never
// with std::terminate's abort.
int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::bad_alloc& e) {
    std::cerr << "nf-ckpt: out of memory (" << e.what() << ")\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "nf-ckpt: " << e.what() << "\n";
    return 1;
  }
}
