// nf-eval: measures a checkpoint as the NormFormer paper does: validation perplexity on a
// preprocessed dataset, and zero-shot accuracy on multiple-choice tasks and LAMBADA. A masked LM
// (model.objective MASKED_LM) gets its masked-LM perplexity; zero-shot tasks, which score
// continuations causally, refuse it.
//
//   nf-eval --checkpoint DIR [--dataset PREFIX] [--task NAME=FILE.jsonl]... [tokenizer flags]
//   mpirun -np N nf-eval ... --tp T --pp P   (data parallelism takes the remaining ranks)
//
// How it gets its pieces (docs/guide.md "Evaluate a checkpoint"):
//   model      the checkpoint's manifest records the model config; every rank builds its stage
//              of the layout --tp x --pp (any layout: parameters are resharded on load, as
//              nf-launch does when resuming), without optimizer state (eval/eval_model.h)
//   tokenizer  the zero-shot tasks are text: nf-preprocess's tokenizer flags name the tokenizer
//              the model was trained with, run in the helper nf-tokenize (eval/tokenizer_client.h)
//   data       perplexity reads tokens already preprocessed: a dataset prefix, the part of
//              data.split the checkpoint's run recorded (validation by default), cut into
//              windows of its train.seq_len (eval/perplexity.h)
//   window     perplexity's windows and the longest task sequence: the run's train.seq_len
//              predictions (positions the model was trained on), model.max_seq_len for a
//              checkpoint that records no run (an import), or --seq-len
//   masks      a masked LM's windows are masked as its run's data.masked_lm recorded, keyed by
//              (--mask-seed, default the run's train.seed; the window's index)
//
// Exit codes: 0 done, 1 a runtime error (an unreadable checkpoint, task or dataset file, a
// failed tokenizer), 2 bad command line.
#include <algorithm>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/load.h"
#include "checkpoint/output_path.h"
#include "checkpoint/save.h"
#include "core/files/atomic_file.h"
#include "core/ops/backend.h"
#include "core/status.h"
#include "data/masked_lm.h"
#include "data/splits.h"
#include "eval/eval_model.h"
#include "eval/perplexity.h"
#include "eval/prepared_tasks.h"
#include "eval/report.h"
#include "eval/run_on_layout.h"
#include "eval/tokenizer_client.h"
#include "eval/zero_shot.h"
#include "google/protobuf/text_format.h"
#include "launcher/train_config.pb.h"
#include "launcher/trainer.h"
#include "model/model_config_check.h"
#include "model/vocab.h"
#include "parallel/mpi_runtime.h"
#include "parallel/process_groups.h"

namespace {

using ::nf::parallel::PrintsSharedErrors;

namespace fs = std::filesystem;

constexpr char kUsage[] =
    R"(usage: nf-eval --checkpoint DIR [--dataset PREFIX [--part NAME] [--split W,W,W]
               [--max-windows N] [--mask-seed N]] [--task NAME=FILE]... [--max-examples N]
               [--seq-len N]
               [--tokenizer gpt2 --vocab-file vocab.json --merges-file merges.txt
                [--parse-special-tokens] | --tokenizer sentencepiece --spm-model FILE]
               [--tp N] [--pp N] [--dtype f32|bf16|f16] [--device cpu|cuda]
               [--batch-size N] [--out FILE.json] [--examples-out FILE.jsonl]

Evaluates a checkpoint (DIR: RUN/checkpoints/iter_NNNNNNN, or a checkpoints directory meaning
the one its `latest` names) and prints a table; --out writes the same as JSON.

perplexity (with --dataset):
  --dataset PREFIX   a dataset nf-preprocess wrote (PREFIX.bin, PREFIX.idx)
  --part NAME        validation (default), test, train, or all of its documents
  --split W,W,W      the train/validation/test weights (default: the data.split the
                     checkpoint's run recorded, else 969,30,1)
  --max-windows N    only the first N windows (default: all)

masked-LM perplexity (a checkpoint with model.objective MASKED_LM, with --dataset):
  the part's whole windows of S tokens (a shorter rest is skipped), window k masked as the
  run's data.masked_lm masked its samples, keyed by (the mask seed, k); the loss is the mean
  cross-entropy over the masked tokens
  --mask-seed N      the masks' seed, 0 to 4294967295 (default: the run's train.seed, else 1)

zero-shot tasks (with --task, repeatable; tokenizer flags required; causal LMs only):
  --task NAME=FILE   NAME hellaswag, piqa, winogrande, storycloze or lambada; FILE JSON Lines
                     with the dataset's fields (docs/guide.md lists them)
  --max-examples N   only the first N examples of each task (default: all)
  --tokenizer ...    the model's tokenizer, as nf-preprocess takes it

window, layout and output:
  --seq-len N        predictions per sequence: perplexity's windows, and the most a task
                     request may have, longer ones losing their oldest context tokens
                     (default: the run's train.seq_len, else model.max_seq_len)
  --tp N, --pp N     tensor and pipeline parallel sizes (default 1); under mpirun data
                     parallelism takes the remaining ranks
  --dtype NAME       the model's dtype while evaluating (default f32)
  --device NAME      cpu (default) or cuda (one GPU per rank)
  --batch-size N     sequences per forward (default 8)
  --out FILE         the results as one JSON object
  --examples-out FILE  every task example's per-choice scores, one JSON object a line

exit codes: 0 done, 1 runtime error, 2 bad command line
)";

struct Flags {
  std::string checkpoint;
  std::string dataset, part = "validation", split;
  int64_t seq_len = 0, max_windows = 0;
  std::optional<uint32_t> mask_seed;
  std::vector<nf::eval::TaskFile> tasks;
  int64_t max_examples = 0;
  nf::eval::TokenizerFlags tokenizer;
  int tp = 1, pp = 1;
  nf::DType dtype = nf::DType::kF32;
  bool cuda = false;
  int64_t batch_size = 8;
  std::string out, examples_out;
};

int UsageError(const std::string& message) {
  if (PrintsSharedErrors()) {
    std::cerr << "nf-eval: " << message << "\n(run nf-eval --help for usage)\n";
  }
  return 2;
}

int SharedFailure(const absl::Status& status) {
  if (PrintsSharedErrors()) std::cerr << "nf-eval: " << status.message() << "\n";
  return 1;
}

bool ParsePositive(const std::string& value, int64_t& out) {
  return absl::SimpleAtoi(value, &out) && out > 0;
}

// The flags, or a usage error's message.
absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--parse-special-tokens") {
      flags.tokenizer.parse_special_tokens = true;
      continue;
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError(arg + " needs a value (or is unknown)");
    const std::string value = argv[++i];
    const auto positive = [&](int64_t& out) -> absl::Status {
      if (ParsePositive(value, out)) return absl::OkStatus();
      return absl::InvalidArgumentError(arg + " takes a positive integer, not '" + value + "'");
    };
    int64_t size = 0;
    absl::Status status;
    if (arg == "--checkpoint") {
      flags.checkpoint = value;
    } else if (arg == "--dataset") {
      flags.dataset = value;
    } else if (arg == "--part") {
      flags.part = value;
    } else if (arg == "--split") {
      flags.split = value;
    } else if (arg == "--seq-len") {
      status = positive(flags.seq_len);
    } else if (arg == "--max-windows") {
      status = positive(flags.max_windows);
    } else if (arg == "--mask-seed") {
      uint32_t seed = 0;
      if (!absl::SimpleAtoi(value, &seed)) {
        return absl::InvalidArgumentError(
            "--mask-seed takes an integer from 0 to 4294967295, not '" + value + "'");
      }
      flags.mask_seed = seed;
    } else if (arg == "--task") {
      const size_t equals = value.find('=');
      if (equals == std::string::npos) {
        return absl::InvalidArgumentError("--task takes NAME=FILE, not '" + value + "'");
      }
      NF_ASSIGN_OR_RETURN(const nf::eval::TaskKind kind,
                          nf::eval::ParseTaskKind(value.substr(0, equals)));
      for (const nf::eval::TaskFile& task : flags.tasks) {
        if (task.kind == kind) {
          return absl::InvalidArgumentError(
              absl::StrCat("--task ", nf::eval::TaskName(kind), " given twice"));
        }
      }
      flags.tasks.push_back({.kind = kind, .path = value.substr(equals + 1)});
    } else if (arg == "--max-examples") {
      status = positive(flags.max_examples);
    } else if (arg == "--tokenizer") {
      flags.tokenizer.tokenizer = value;
    } else if (arg == "--vocab-file") {
      flags.tokenizer.vocab_file = value;
    } else if (arg == "--merges-file") {
      flags.tokenizer.merges_file = value;
    } else if (arg == "--spm-model") {
      flags.tokenizer.spm_model = value;
    } else if (arg == "--tp" || arg == "--pp") {
      status = positive(size);
      (arg == "--tp" ? flags.tp : flags.pp) = static_cast<int>(size);
    } else if (arg == "--dtype") {
      NF_ASSIGN_OR_RETURN(flags.dtype, nf::ParseDType(value));
      if (flags.dtype != nf::DType::kF32 && flags.dtype != nf::DType::kBF16 &&
          flags.dtype != nf::DType::kF16) {
        return absl::InvalidArgumentError("--dtype takes f32, bf16 or f16");
      }
    } else if (arg == "--device") {
      if (value != "cpu" && value != "cuda") {
        return absl::InvalidArgumentError("--device takes cpu or cuda, not '" + value + "'");
      }
      flags.cuda = value == "cuda";
    } else if (arg == "--batch-size") {
      status = positive(flags.batch_size);
    } else if (arg == "--out") {
      flags.out = value;
    } else if (arg == "--examples-out") {
      flags.examples_out = value;
    } else {
      return absl::InvalidArgumentError("unknown argument '" + arg + "'");
    }
    NF_RETURN_IF_ERROR(status);
  }
  if (flags.checkpoint.empty()) return absl::InvalidArgumentError("--checkpoint is required");
  if (flags.dataset.empty() && flags.tasks.empty()) {
    return absl::InvalidArgumentError("nothing to evaluate: give --dataset and/or --task");
  }
  if (!flags.tasks.empty()) NF_RETURN_IF_ERROR(nf::eval::CheckTokenizerFlags(flags.tokenizer));
  if (flags.tasks.empty() && !flags.tokenizer.tokenizer.empty()) {
    return absl::InvalidArgumentError("tokenizer flags are for --task (perplexity reads tokens)");
  }
  if (flags.dataset.empty() &&
      (flags.max_windows > 0 || !flags.split.empty() || flags.mask_seed.has_value())) {
    return absl::InvalidArgumentError("--max-windows, --split and --mask-seed are for --dataset");
  }
  if (flags.tasks.empty() && (flags.max_examples > 0 || !flags.examples_out.empty())) {
    return absl::InvalidArgumentError("--max-examples and --examples-out are for --task");
  }
  // Refused before the evaluation runs, not after it: a report is never written into a checkpoint
  // or over what the evaluation reads.
  std::vector<nf::checkpoint::ToolInput> inputs = {{flags.checkpoint, "--checkpoint"},
                                                   {flags.tokenizer.vocab_file, "--vocab-file"},
                                                   {flags.tokenizer.merges_file, "--merges-file"},
                                                   {flags.tokenizer.spm_model, "--spm-model"}};
  const std::string bin = flags.dataset.empty() ? "" : flags.dataset + ".bin";
  const std::string idx = flags.dataset.empty() ? "" : flags.dataset + ".idx";
  inputs.push_back({bin, "--dataset"});
  inputs.push_back({idx, "--dataset"});
  for (const nf::eval::TaskFile& task : flags.tasks) inputs.push_back({task.path, "--task"});
  if (!flags.out.empty()) {
    NF_RETURN_IF_ERROR(nf::checkpoint::CheckOutputPath(flags.out, "--out", inputs));
  }
  if (!flags.examples_out.empty()) {
    NF_RETURN_IF_ERROR(
        nf::checkpoint::CheckOutputPath(flags.examples_out, "--examples-out", inputs));
  }
  std::error_code error;
  if (!flags.out.empty() &&
      fs::weakly_canonical(flags.out, error) == fs::weakly_canonical(flags.examples_out, error)) {
    return absl::InvalidArgumentError(absl::StrCat("--out and --examples-out name the same file ",
                                                   flags.out, ": give each its own"));
  }
  return flags;
}

// The checkpoint DIR names: itself, or the one a checkpoints directory's `latest` names.
absl::StatusOr<fs::path> ResolveCheckpoint(const fs::path& dir) {
  std::error_code error;
  if (fs::exists(dir / nf::checkpoint::kLatestName, error)) {
    return nf::checkpoint::LatestCheckpoint(dir);
  }
  return dir;
}

// The run configuration the checkpoint records (empty for an imported one).
nf::launcher::TrainConfig RecordedTrainConfig(const nf::checkpoint::Manifest& manifest) {
  nf::launcher::TrainConfig config;
  if (!google::protobuf::TextFormat::ParseFromString(manifest.train_config(), &config)) {
    config.Clear();
  }
  return config;
}

// The documents of `part` of a dataset.
absl::StatusOr<nf::data::DocumentRange> PartDocuments(const std::string& prefix,
                                                      const std::string& part,
                                                      const std::string& split) {
  NF_ASSIGN_OR_RETURN(const auto dataset, nf::data::IndexedDataset::Open(prefix));
  if (part == "all") return nf::data::DocumentRange{0, dataset->num_documents()};
  const std::vector<std::string> parts = {"train", "validation", "test"};
  const auto index = std::find(parts.begin(), parts.end(), part) - parts.begin();
  if (index == static_cast<int64_t>(parts.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--part takes train, validation, test or all, not '", part, "'"));
  }
  NF_ASSIGN_OR_RETURN(const auto ranges, nf::data::ParseSplit(split, dataset->num_documents()));
  if (index >= static_cast<int64_t>(ranges.size()) || ranges[index].size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", part, " part of ", prefix, " under split \"", split, "\" holds no documents"));
  }
  return ranges[index];
}

// Everything each rank knows before MPI starts.
struct Plan {
  Flags flags;
  fs::path checkpoint;
  nf::checkpoint::Manifest manifest;
  std::string split;
  nf::data::DocumentRange documents;
  int64_t seq_len = 0;  // the window: predictions per sequence (a masked LM's: tokens)
  // A masked LM's perplexity: how its windows are masked (absent for a causal LM).
  std::optional<nf::data::MaskedLmSpec> masking;
  std::vector<nf::eval::PreparedTask> tasks;
};

absl::StatusOr<Plan> MakePlan(Flags flags) {
  Plan plan;
  NF_ASSIGN_OR_RETURN(plan.checkpoint, ResolveCheckpoint(flags.checkpoint));
  NF_ASSIGN_OR_RETURN(plan.manifest, nf::checkpoint::ReadManifest(plan.checkpoint));
  const nf::model::ModelConfig& model = plan.manifest.model();
  // A zero-shot request scores a continuation from its context alone: a causal LM's question.
  if (!flags.tasks.empty()) {
    NF_RETURN_IF_ERROR(
        nf::model::RequireCausalLm(model, "--task (zero-shot tasks score causally)"));
  }
  const bool masked_lm = model.objective() == nf::model::ModelConfig::MASKED_LM;
  if (flags.mask_seed.has_value() && !masked_lm) {
    return absl::InvalidArgumentError(
        "--mask-seed is for a masked LM, and this model is causal (model.objective CAUSAL_LM)");
  }
  const nf::launcher::TrainConfig recorded = RecordedTrainConfig(plan.manifest);
  // The positions the model was trained on; a checkpoint that records no run (an import) is
  // taken at its word, model.max_seq_len.
  plan.seq_len = flags.seq_len > 0                ? flags.seq_len
                 : recorded.train().has_seq_len() ? recorded.train().seq_len()
                                                  : model.max_seq_len();
  if (plan.seq_len > model.max_seq_len()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--seq-len ", plan.seq_len, " exceeds model.max_seq_len ", model.max_seq_len()));
  }
  if (!flags.dataset.empty()) {
    plan.split = !flags.split.empty() ? flags.split : recorded.data().split();
    NF_ASSIGN_OR_RETURN(plan.documents, PartDocuments(flags.dataset, flags.part, plan.split));
    if (masked_lm) {
      // As the run masked its samples (launcher/batch_source.cc); a checkpoint that records no
      // run gets data.masked_lm's defaults and train.seed's (1).
      const nf::launcher::MaskedLmConfig& rates = recorded.data().masked_lm();
      plan.masking =
          nf::data::MaskedLmSpec{.mask_prob = rates.mask_prob(),
                                 .random_token_prob = rates.random_token_prob(),
                                 .leave_unmasked_prob = rates.leave_unmasked_prob(),
                                 .mask_token = nf::model::MaskTokenId(model),
                                 .vocab_size = model.vocab_size(),
                                 .seed = flags.mask_seed.value_or(recorded.train().seed())};
    }
  }
  if (!flags.tasks.empty()) {
    NF_ASSIGN_OR_RETURN(const std::string helper, nf::eval::ProgramBesideThisOne("nf-tokenize"));
    auto tasks = nf::eval::PrepareTasks(flags.tasks, {.max_examples = flags.max_examples,
                                                      .tokenizer_program = helper,
                                                      .tokenizer = flags.tokenizer,
                                                      .window = plan.seq_len,
                                                      .model_vocab = model.vocab_size()});
    // A task file that does not read is bad data, not a bad command line.
    if (!tasks.ok()) return absl::FailedPreconditionError(tasks.status().message());
    plan.tasks = *std::move(tasks);
  }
  plan.flags = std::move(flags);
  return plan;
}

// The device of this rank and the communicators for its device tensors: NCCL over the groups on
// a multi-process GPU job (kept in `device_groups`), else the groups themselves.
absl::StatusOr<nf::eval::EvalRank> RankOf(const Flags& flags, nf::parallel::ProcessGroups& groups,
                                          nf::parallel::DeviceGroups& device_groups) {
  nf::launcher::TrainOptions device_options;
  device_options.set_device(flags.cuda ? nf::launcher::TrainOptions::CUDA
                                       : nf::launcher::TrainOptions::CPU);
  NF_ASSIGN_OR_RETURN(const nf::Device device, nf::launcher::TrainingDevice(device_options));
  NF_RETURN_IF_ERROR(nf::launcher::CheckOneRankPerGpu(groups, device));
#if NF_WITH_CUDA
  if (device.type == nf::DeviceType::kCuda && groups.topology.world_size() > 1) {
    NF_ASSIGN_OR_RETURN(device_groups, nf::parallel::CreateDeviceGroups(groups, device));
  }
#endif
  return nf::eval::EvalRank{
      .groups = &groups,
      .device_tp = device_groups.tp ? device_groups.tp.get() : groups.tp.get(),
      .device_pp = device_groups.pp ? device_groups.pp.get() : groups.pp.get(),
      .device = device};
}

// One task's entry of the report from its sequences' scores, and its examples' JSON lines.
void AddTaskResults(const nf::eval::PreparedTask& task,
                    const std::vector<nf::eval::SequenceScore>& scores,
                    nf::eval::EvalReport& report, std::string& example_lines) {
  const std::vector<nf::eval::ScoredExample> examples = nf::eval::ScoredExamples(task, scores);
  nf::eval::TaskReport& entry = report.tasks.emplace_back();
  entry.kind = task.kind;
  entry.file = task.file;
  entry.truncated = task.truncated();
  if (nf::eval::IsMultipleChoice(task.kind)) {
    entry.multiple_choice = nf::eval::ScoreMultipleChoice(examples);
  } else {
    entry.last_word = nf::eval::ScoreLastWord(examples);
  }
  for (size_t e = 0; e < examples.size(); ++e) {
    example_lines += nf::eval::ExampleLine(task.kind, static_cast<int64_t>(e), examples[e]);
  }
}

// The evaluation on this rank of the layout; rank 0 prints and writes the results.
absl::Status Evaluate(const Plan& plan, nf::parallel::ProcessGroups& groups) {
  const Flags& flags = plan.flags;
  const nf::parallel::Topology& topology = groups.topology;
  nf::parallel::DeviceGroups device_groups;
  NF_ASSIGN_OR_RETURN(const nf::eval::EvalRank rank, RankOf(flags, groups, device_groups));
  nf::eval::EvalReport report;
  report.checkpoint = plan.checkpoint.string();
  report.step = plan.manifest.step();
  report.tensor_parallel = topology.tp();
  report.pipeline_parallel = topology.pp();
  report.data_parallel = topology.dp();
  report.dtype = std::string(nf::DTypeName(flags.dtype));

  // Each phase has a model shaped for its sequences; the second copies the first's parameters.
  std::unique_ptr<nf::eval::EvalModel> loaded;
  const auto model_for =
      [&](int64_t seq_len) -> absl::StatusOr<std::unique_ptr<nf::eval::EvalModel>> {
    NF_ASSIGN_OR_RETURN(auto model, nf::eval::EvalModel::Create(plan.manifest.model(), flags.dtype,
                                                                flags.batch_size, seq_len, rank));
    NF_RETURN_IF_ERROR(loaded ? model->CopyParameters(*loaded)
                              : model->Load(plan.checkpoint, plan.manifest));
    return model;
  };
  if (!flags.dataset.empty()) {
    NF_ASSIGN_OR_RETURN(loaded, model_for(plan.seq_len));
    NF_ASSIGN_OR_RETURN(const nf::eval::DocumentTokens tokens,
                        nf::eval::DocumentTokens::Open(flags.dataset, plan.documents));
    NF_ASSIGN_OR_RETURN(
        const nf::eval::PerplexityResult result,
        plan.masking ? nf::eval::EvaluateMaskedPerplexity(*loaded, groups, tokens, *plan.masking,
                                                          flags.max_windows)
                     : nf::eval::EvaluatePerplexity(*loaded, groups, tokens, flags.max_windows));
    report.perplexity = nf::eval::PerplexityReport{.dataset = flags.dataset,
                                                   .part = flags.part,
                                                   .split = flags.part == "all" ? "" : plan.split,
                                                   .documents = plan.documents,
                                                   .seq_len = plan.seq_len,
                                                   .result = result};
  }
  std::string example_lines;
  if (!plan.tasks.empty()) {
    // Every task's sequences in one stream of micro-batches.
    NF_ASSIGN_OR_RETURN(loaded, model_for(nf::eval::LongestInput(plan.tasks)));
    std::vector<nf::eval::ScoredSequence> sequences;
    for (const nf::eval::PreparedTask& task : plan.tasks) {
      sequences.insert(sequences.end(), task.sequences.begin(), task.sequences.end());
    }
    NF_ASSIGN_OR_RETURN(const std::vector<nf::eval::SequenceScore> scores,
                        nf::eval::ScoreSequences(*loaded, groups, sequences));
    auto next = scores.begin();
    for (const nf::eval::PreparedTask& task : plan.tasks) {
      const auto end = next + static_cast<std::ptrdiff_t>(task.sequences.size());
      AddTaskResults(task, std::vector<nf::eval::SequenceScore>(next, end), report, example_lines);
      next = end;
    }
  }
  if (topology.world_rank() != 0) return absl::OkStatus();
  std::cout << nf::eval::ReportTable(report);
  if (!flags.out.empty())
    NF_RETURN_IF_ERROR(nf::ReplaceFileAtomically(flags.out, nf::eval::ReportJson(report)));
  if (!flags.examples_out.empty())
    NF_RETURN_IF_ERROR(nf::ReplaceFileAtomically(flags.examples_out, example_lines));
  return absl::OkStatus();
}

int Run(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::cout << kUsage;
      return 0;
    }
  }
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) return UsageError(std::string(flags.status().message()));
  const int tp = flags->tp, pp = flags->pp;
  if (flags->cuda && nf::ops::GpuCount() == 0) {
    return UsageError(nf::launcher::NoGpuMessage("--device cuda", nf::ops::GpuCountError()));
  }
  // Before MPI: reading the checkpoint's manifest, the task files and the dataset's index, and
  // tokenizing in a child process. Every rank does the same and meets the same errors.
  absl::StatusOr<Plan> plan = MakePlan(*std::move(flags));
  if (!plan.ok()) {
    return plan.status().code() == absl::StatusCode::kInvalidArgument
               ? UsageError(std::string(plan.status().message()))
               : SharedFailure(plan.status());
  }
  return nf::eval::RunOnLayout(
      "nf-eval", {.tp = tp, .pp = pp, .dp = 0},
      [&](nf::parallel::ProcessGroups& groups) { return Evaluate(*plan, groups); });
}

}  // namespace

int main(int argc, char** argv) {
  return nf::parallel::RunCatchingExceptions("nf-eval", Run, argc, argv);
}
