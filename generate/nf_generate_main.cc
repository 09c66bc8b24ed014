// nf-generate: text from a checkpoint, with the tokenizer its run was trained with.
//
//   nf-generate --checkpoint DIR [--prompt TEXT]... [--prompt-file FILE] [tokenizer flags]
//               [--max-new-tokens N] [--greedy | --temperature T] [--top-k K] [--top-p P]
//               [--seed S] [--out FILE.jsonl]
//   mpirun -np T*P nf-generate ... --tp T --pp P
//
// How (docs/guide.md "Generate text"): every rank builds its stage of the layout and loads the
// checkpoint's parameters (any layout's checkpoint, resharded on load as nf-eval does:
// eval::CreateStageModel, checkpoint::LoadParameters). Each prompt (after the end-of-document
// token, where documents start in training) is fed one token at a time through a KV cache
// (NormFormerModel::ForwardCached), and each new token drawn from the full logits that every
// rank holds (generate/pipeline_lm.h), so all ranks take the same tokens. Prompts are tokenized
// by nf-tokenize before MPI starts (as nf-eval does) and the tokens decoded by a second
// nf-tokenize kept running beside rank 0 (generate/text_decoder.h).
//
// Exit codes: 0 done, 1 a runtime error, 2 bad command line.
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
#include "core/status.h"
#include "eval/eval_model.h"
#include "eval/run_on_layout.h"
#include "eval/tokenizer_client.h"
#include "generate/generation.h"
#include "generate/pipeline_lm.h"
#include "generate/prompts.h"
#include "generate/text_decoder.h"
#include "launcher/jsonl_log.h"
#include "launcher/train_config.pb.h"
#include "launcher/trainer.h"
#include "model/model_config_check.h"
#include "parallel/mpi_runtime.h"
#include "parallel/process_groups.h"

namespace {

using ::nf::parallel::PrintsSharedErrors;

namespace fs = std::filesystem;

constexpr char kUsage[] =
    R"(usage: nf-generate --checkpoint DIR [--prompt TEXT]... [--prompt-file FILE]
               (--tokenizer gpt2 --vocab-file vocab.json --merges-file merges.txt
                [--parse-special-tokens] | --tokenizer sentencepiece --spm-model FILE)
               [--max-new-tokens N] [--greedy | --temperature T] [--top-k K] [--top-p P]
               [--seed S] [--tp N] [--pp N] [--dtype f32|bf16|f16] [--device cpu|cuda]
               [--out FILE.jsonl]

Continues each prompt with text from a checkpoint (DIR: RUN/checkpoints/iter_NNNNNNN, or a
checkpoints directory meaning the one its `latest` names) and prints prompt and continuation.

prompts (at least one; none: --prompt ""):
  --prompt TEXT       a prompt (repeatable)
  --prompt-file FILE  one prompt a line, or JSON Lines with a "prompt" (or "text") string
  --tokenizer ...     the model's tokenizer, as nf-preprocess takes it

decoding:
  --max-new-tokens N  at most N new tokens (default 64; fewer when the model's max_seq_len
                      ends first); a sequence also ends at the end-of-document token
  --greedy            the most likely token each step (= --temperature 0)
  --temperature T     sample from softmax(logits / T) (default 1)
  --top-k K           only the K most likely tokens (default 0: all)
  --top-p P           only the fewest most likely tokens whose probability reaches P (default 1)
  --seed S            the draws' seed (default 1): the same seed gives the same text on any
                      layout

layout and output:
  --tp N, --pp N      tensor and pipeline parallel sizes (default 1; run under mpirun -np N*P)
  --dtype NAME        the model's dtype while generating (default f32)
  --device NAME       cpu (default) or cuda (one GPU per rank)
  --out FILE          one JSON object a prompt: prompt, text, prompt_ids, ids, ended_document

exit codes: 0 done, 1 runtime error, 2 bad command line
)";

struct Flags {
  std::string checkpoint;
  std::vector<std::string> prompts;
  std::string prompt_file;
  nf::eval::TokenizerFlags tokenizer;
  nf::generate::GenerationOptions generation;
  int tp = 1, pp = 1;
  nf::DType dtype = nf::DType::kF32;
  bool cuda = false;
  std::string out;
};

int UsageError(const std::string& message) {
  if (PrintsSharedErrors()) {
    std::cerr << "nf-generate: " << message << "\n(run nf-generate --help for usage)\n";
  }
  return 2;
}

int SharedFailure(const absl::Status& status) {
  if (PrintsSharedErrors()) std::cerr << "nf-generate: " << status.message() << "\n";
  return 1;
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  nf::generate::SamplingOptions& sampling = flags.generation.sampling;
  bool greedy = false, temperature_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--parse-special-tokens") {
      flags.tokenizer.parse_special_tokens = true;
      continue;
    }
    if (arg == "--greedy") {
      greedy = true;
      continue;
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError(arg + " needs a value (or is unknown)");
    const std::string value = argv[++i];
    const auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(arg + " takes " + what + ", not '" + value + "'");
    };
    int64_t number = 0;
    if (arg == "--checkpoint") {
      flags.checkpoint = value;
    } else if (arg == "--prompt") {
      flags.prompts.push_back(value);
    } else if (arg == "--prompt-file") {
      flags.prompt_file = value;
    } else if (arg == "--tokenizer") {
      flags.tokenizer.tokenizer = value;
    } else if (arg == "--vocab-file") {
      flags.tokenizer.vocab_file = value;
    } else if (arg == "--merges-file") {
      flags.tokenizer.merges_file = value;
    } else if (arg == "--spm-model") {
      flags.tokenizer.spm_model = value;
    } else if (arg == "--max-new-tokens") {
      if (!absl::SimpleAtoi(value, &number) || number < 0) return bad("an integer >= 0");
      flags.generation.max_new_tokens = number;
    } else if (arg == "--temperature") {
      if (!absl::SimpleAtod(value, &sampling.temperature)) return bad("a number");
      temperature_given = true;
    } else if (arg == "--top-k") {
      if (!absl::SimpleAtoi(value, &sampling.top_k)) return bad("an integer");
    } else if (arg == "--top-p") {
      if (!absl::SimpleAtod(value, &sampling.top_p)) return bad("a number");
    } else if (arg == "--seed") {
      if (!absl::SimpleAtoi(value, &sampling.seed)) return bad("an integer >= 0");
    } else if (arg == "--tp" || arg == "--pp") {
      if (!absl::SimpleAtoi(value, &number) || number <= 0) return bad("a positive integer");
      (arg == "--tp" ? flags.tp : flags.pp) = static_cast<int>(number);
    } else if (arg == "--dtype") {
      NF_ASSIGN_OR_RETURN(flags.dtype, nf::ParseDType(value));
      if (flags.dtype != nf::DType::kF32 && flags.dtype != nf::DType::kBF16 &&
          flags.dtype != nf::DType::kF16) {
        return bad("f32, bf16 or f16");
      }
    } else if (arg == "--device") {
      if (value != "cpu" && value != "cuda") return bad("cpu or cuda");
      flags.cuda = value == "cuda";
    } else if (arg == "--out") {
      flags.out = value;
    } else {
      return absl::InvalidArgumentError("unknown argument '" + arg + "'");
    }
  }
  if (greedy && temperature_given) {
    return absl::InvalidArgumentError(
        "--greedy is --temperature 0: give one of --greedy and --temperature, not both");
  }
  if (greedy) sampling.temperature = 0.0;
  if (flags.checkpoint.empty()) return absl::InvalidArgumentError("--checkpoint is required");
  NF_RETURN_IF_ERROR(nf::eval::CheckTokenizerFlags(flags.tokenizer));
  NF_RETURN_IF_ERROR(nf::generate::CheckSamplingOptions(sampling));
  // Refused before the model loads: the text never goes into a checkpoint or over an input.
  if (!flags.out.empty()) {
    const nf::checkpoint::ToolInput inputs[] = {{flags.checkpoint, "--checkpoint"},
                                                {flags.prompt_file, "--prompt-file"},
                                                {flags.tokenizer.vocab_file, "--vocab-file"},
                                                {flags.tokenizer.merges_file, "--merges-file"},
                                                {flags.tokenizer.spm_model, "--spm-model"}};
    NF_RETURN_IF_ERROR(nf::checkpoint::CheckOutputPath(flags.out, "--out", inputs));
  }
  return flags;
}

// Everything each rank knows before MPI starts.
struct Plan {
  Flags flags;
  fs::path checkpoint;
  nf::checkpoint::Manifest manifest;
  std::vector<std::string> prompts;
  std::vector<std::vector<int32_t>> contexts;  // per prompt: what the model is fed
};

absl::StatusOr<Plan> MakePlan(Flags flags) {
  Plan plan;
  std::error_code error;
  plan.checkpoint = fs::exists(fs::path(flags.checkpoint) / nf::checkpoint::kLatestName, error)
                        ? nf::checkpoint::LatestCheckpoint(flags.checkpoint).value_or("")
                        : fs::path(flags.checkpoint);
  if (plan.checkpoint.empty()) {
    return absl::NotFoundError(absl::StrCat(flags.checkpoint, "/latest names no checkpoint"));
  }
  NF_ASSIGN_OR_RETURN(plan.manifest, nf::checkpoint::ReadManifest(plan.checkpoint));
  NF_RETURN_IF_ERROR(nf::model::RequireCausalLm(plan.manifest.model(), "nf-generate"));
  plan.prompts = flags.prompts;
  if (!flags.prompt_file.empty()) {
    NF_ASSIGN_OR_RETURN(const std::vector<std::string> more,
                        nf::generate::ReadPromptFile(flags.prompt_file));
    plan.prompts.insert(plan.prompts.end(), more.begin(), more.end());
  }
  if (plan.prompts.empty()) plan.prompts.push_back("");
  NF_ASSIGN_OR_RETURN(const std::string helper, nf::eval::ProgramBesideThisOne("nf-tokenize"));
  NF_ASSIGN_OR_RETURN(const nf::eval::TokenizedTexts tokenized,
                      nf::eval::TokenizeTexts(helper, flags.tokenizer, plan.prompts));
  const nf::model::ModelConfig& model = plan.manifest.model();
  if (tokenized.vocab_size > model.vocab_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the tokenizer's ", tokenized.vocab_size, " ids exceed the model's vocabulary of ",
        model.vocab_size(), ": not the tokenizer it was trained with"));
  }
  flags.generation.end_of_document = tokenized.end_of_document;
  for (size_t i = 0; i < plan.prompts.size(); ++i) {
    std::vector<int32_t> context;
    if (tokenized.end_of_document) context.push_back(*tokenized.end_of_document);
    context.insert(context.end(), tokenized.ids[i].begin(), tokenized.ids[i].end());
    if (context.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt ", i + 1,
                       " is empty and the tokenizer has no end-of-document token to start from"));
    }
    if (static_cast<int64_t>(context.size()) >= model.max_seq_len()) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt ", i + 1, " has ", context.size(),
                       " tokens (with the end-of-document token before it): the model's "
                       "max_seq_len ",
                       model.max_seq_len(), " leaves no room to generate"));
    }
    plan.contexts.push_back(std::move(context));
  }
  plan.flags = std::move(flags);
  return plan;
}

// Generates for every prompt on this rank of the layout; rank 0 decodes, prints and writes.
absl::Status Generate(const Plan& plan, nf::parallel::ProcessGroups& groups,
                      nf::generate::TextDecoder* decoder) {
  const Flags& flags = plan.flags;
  nf::launcher::TrainOptions device_options;
  device_options.set_device(flags.cuda ? nf::launcher::TrainOptions::CUDA
                                       : nf::launcher::TrainOptions::CPU);
  NF_ASSIGN_OR_RETURN(const nf::Device device, nf::launcher::TrainingDevice(device_options));
  NF_RETURN_IF_ERROR(nf::launcher::CheckOneRankPerGpu(groups, device));
  nf::parallel::DeviceGroups device_groups;
#if NF_WITH_CUDA
  if (device.type == nf::DeviceType::kCuda && groups.topology.world_size() > 1) {
    NF_ASSIGN_OR_RETURN(device_groups, nf::parallel::CreateDeviceGroups(groups, device));
  }
#endif
  const nf::eval::EvalRank rank = {
      .groups = &groups,
      .device_tp = device_groups.tp ? device_groups.tp.get() : groups.tp.get(),
      .device_pp = device_groups.pp ? device_groups.pp.get() : groups.pp.get(),
      .device = device};
  const nf::model::ModelConfig& config = plan.manifest.model();
  NF_ASSIGN_OR_RETURN(auto lm, nf::generate::PipelineLm::Create(config, flags.dtype, 1, rank));
  NF_RETURN_IF_ERROR(lm->Load(plan.checkpoint, plan.manifest));
  // Written under a temporary name of its own and renamed over --out at the end: a link at --out
  // is replaced, never written through.
  std::optional<nf::AtomicFileWriter> out;
  if (decoder != nullptr && !flags.out.empty()) {
    NF_ASSIGN_OR_RETURN(nf::AtomicFileWriter created, nf::AtomicFileWriter::Create(flags.out));
    out.emplace(std::move(created));
  }
  for (size_t i = 0; i < plan.contexts.size(); ++i) {
    const std::vector<int32_t>& context = plan.contexts[i];
    nf::generate::GenerationOptions options = flags.generation;
    const int64_t room = config.max_seq_len() - static_cast<int64_t>(context.size());
    options.max_new_tokens = std::min(options.max_new_tokens, room);
    NF_RETURN_IF_ERROR(
        lm->StartSequence(static_cast<int64_t>(context.size()) + options.max_new_tokens));
    NF_ASSIGN_OR_RETURN(const nf::generate::Generated generated,
                        nf::generate::GenerateTokens(context, options, i, [&](int32_t token) {
                          return lm->Cached({&token, 1});
                        }));
    if (decoder == nullptr) continue;
    const std::vector<int32_t> prompt_ids(
        context.begin() + (flags.generation.end_of_document ? 1 : 0), context.end());
    NF_ASSIGN_OR_RETURN(const std::string raw_text,
                        nf::generate::ContinuationText(
                            prompt_ids, generated.ids,
                            [&](std::span<const int32_t> ids) { return decoder->Decode(ids); }));
    const std::string text = nf::generate::ValidUtf8(raw_text);
    std::cout << "--- " << i + 1 << "\n" << plan.prompts[i] << text << "\n" << std::flush;
    if (out) {
      const std::string line = nf::launcher::JsonObject()
                                   .AddString("prompt", nf::generate::ValidUtf8(plan.prompts[i]))
                                   .AddString("text", text)
                                   .AddIntArray("prompt_ids", prompt_ids)
                                   .AddIntArray("ids", generated.ids)
                                   .AddBool("ended_document", generated.ended_document)
                                   .ToString() +
                               "\n";
      NF_RETURN_IF_ERROR(out->Append(line.data(), static_cast<int64_t>(line.size())));
    }
  }
  if (out) NF_RETURN_IF_ERROR(out->Commit(nf::OnCommit::kReplace));
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
  // Before MPI: the manifest, the prompts tokenized in a child process, and rank 0's decoder.
  absl::StatusOr<Plan> plan = MakePlan(*std::move(flags));
  if (!plan.ok()) {
    return plan.status().code() == absl::StatusCode::kInvalidArgument
               ? UsageError(std::string(plan.status().message()))
               : SharedFailure(plan.status());
  }
  std::unique_ptr<nf::generate::TextDecoder> decoder;
  if (PrintsSharedErrors()) {
    const absl::StatusOr<std::string> helper = nf::eval::ProgramBesideThisOne("nf-tokenize");
    if (!helper.ok()) return SharedFailure(helper.status());
    absl::StatusOr<std::unique_ptr<nf::generate::TextDecoder>> started =
        nf::generate::TextDecoder::Start(*helper, plan->flags.tokenizer);
    if (!started.ok()) return SharedFailure(started.status());
    decoder = *std::move(started);
  }
  return nf::eval::RunOnLayout(
      "nf-generate", {.tp = tp, .pp = pp, .dp = 1},
      [&](nf::parallel::ProcessGroups& groups) { return Generate(*plan, groups, decoder.get()); });
}

}  // namespace

int main(int argc, char** argv) {
  return nf::parallel::RunCatchingExceptions("nf-generate", Run, argc, argv);
}
