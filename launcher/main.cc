// nf-launch: trains a NormFormer language model.
//
//   nf-launch --config deploy/configs/tiny.pbtxt [--set field.path=value]... --run-dir DIR
//
// Exit codes: 0 finished; 1 a runtime error; 2 bad command line or configuration.
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "launcher/config.h"
#include "launcher/train_loop.h"

namespace {

constexpr char kUsage[] =
    R"(usage: nf-launch --config FILE.pbtxt [--set field.path=value]... --run-dir DIR

Trains a NormFormer language model as FILE.pbtxt (protobuf text format, schema
launcher/train_config.proto) describes, writing into DIR:
  config.pbtxt  the resolved configuration, every field written out
  log.jsonl     one JSON object per step: step, loss, ppl, lr, loss_scale,
                grad_norm, skipped, skipped_total, tokens, seconds

options:
  --config FILE      the run configuration (deploy/configs/ has examples)
  --set PATH=VALUE   override one field, e.g. --set train.optimizer.lr=6e-4
                     --set model.normformer.scale_attn=false; repeatable, applied in order
  --run-dir DIR      where the run writes its files (created if missing)
  --help             this text

The Pre-LN GPT baseline of any config: --set model.normformer.scale_attn=false
  --set model.normformer.scale_heads=false --set model.normformer.scale_fc=false
  --set model.normformer.scale_resids=false

exit codes: 0 done, 1 runtime error, 2 bad command line or configuration
)";

int UsageError(const std::string& message) {
  std::cerr << "nf-launch: " << message << "\n(run nf-launch --help for usage)\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, run_dir;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    const bool takes_value = arg == "--config" || arg == "--set" || arg == "--run-dir";
    if (!takes_value) return UsageError("unknown argument '" + arg + "'");
    if (i + 1 >= argc) return UsageError(arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--config") config_path = value;
    if (arg == "--set") overrides.push_back(value);
    if (arg == "--run-dir") run_dir = value;
  }
  if (config_path.empty()) return UsageError("--config is required");
  if (run_dir.empty()) return UsageError("--run-dir is required");

  const auto config = nf::launcher::LoadTrainConfig(config_path, overrides);
  if (!config.ok()) {
    std::cerr << "nf-launch: " << config.status().message() << "\n";
    return 2;
  }
  const absl::Status status = nf::launcher::RunTraining(*config, run_dir, std::cout);
  if (!status.ok()) {
    std::cerr << "nf-launch: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
