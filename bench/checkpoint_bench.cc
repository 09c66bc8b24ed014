// nf-bench-checkpoint: checkpoint save and load throughput on one process, next to `dd`
// writing and reading a file of the same size on the same disk in the same run (the ceiling:
// one sequential stream with fsync), and how long an async save blocks the training loop
// (Start, and the next step's optimizer update waiting for the snapshot copy that runs beside
// its forward and backward) against a whole synchronous save. Before every read, the files'
// pages are dropped from the page cache (posix_fadvise DONTNEED), for dd and for the load alike.
//
//   build/bench/nf-bench-checkpoint [--dir DIR] [--d-model N] [--layers N] [--trials N]
//                                   [--seq-len N]
//
// The default model (12 layers, d_model 512, vocab 32000: 54M parameters, fp32 with master
// weights and both moments: 0.9 GB per checkpoint) is big enough that the disk, not the
// per-file overheads, sets the rates. The training step is 4 sequences of --seq-len tokens
// (128): a shorter one, like a GPU's step beside the host's copy, shows what an async save's
// copy costs when the step cannot hide it.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/statistics.h"
#include "checkpoint/load.h"
#include "checkpoint/save.h"
#include "core/status.h"
#include "launcher/trainer.h"
#include "parallel/local_communicator.h"

namespace nf::bench {
namespace {

namespace fs = std::filesystem;

// Evicts every file under `path` from the page cache (clean pages only: call after fsync).
void DropCache(const fs::path& path) {
  const auto drop = [](const fs::path& file) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  };
  std::error_code error;
  if (fs::is_directory(path, error)) {
    for (fs::recursive_directory_iterator it(path, error), end; !error && it != end;
         it.increment(error)) {
      if (it->is_regular_file(error)) drop(it->path());
    }
  } else {
    drop(path);
  }
}

int64_t DirectoryBytes(const fs::path& dir) {
  int64_t bytes = 0;
  std::error_code error;
  for (fs::recursive_directory_iterator it(dir, error), end; !error && it != end;
       it.increment(error)) {
    if (it->is_regular_file(error)) bytes += static_cast<int64_t>(it->file_size(error));
  }
  return bytes;
}

absl::Status Run(int argc, char** argv) {
  std::error_code error;
  fs::path temp = fs::temp_directory_path(error);  // $TMPDIR, if it is a directory
  fs::path dir = (error ? fs::path("/tmp") : temp) / "nf_bench_checkpoint";
  int d_model = 512, layers = 12, trials = 3, seq_len = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dir")
      dir = argv[i + 1];
    else if (flag == "--d-model")
      d_model = std::atoi(argv[i + 1]);
    else if (flag == "--layers")
      layers = std::atoi(argv[i + 1]);
    else if (flag == "--trials")
      trials = std::atoi(argv[i + 1]);
    else if (flag == "--seq-len")
      seq_len = std::atoi(argv[i + 1]);
    else
      return absl::InvalidArgumentError("unknown flag " + flag);
  }
  launcher::TrainConfig config;
  model::ModelConfig& m = *config.mutable_model();
  m.set_num_layers(layers);
  m.set_d_model(d_model);
  m.set_num_heads(8);
  m.set_ffn_dim(4 * d_model);
  m.set_vocab_size(32000);
  // A step of 4 x 128 tokens by default (~0.5-4 s of forward and backward here): an async
  // save's copy runs beside a step's forward and backward, so a step of a size people train with.
  constexpr int kBatch = 4;
  const int step_tokens = seq_len * kBatch;
  m.set_max_seq_len(seq_len);
  config.mutable_train()->set_seq_len(seq_len);
  config.mutable_train()->set_micro_batch_size(kBatch);
  config.mutable_train()->set_global_batch_size(kBatch);
  config.mutable_train()->mutable_lr_schedule()->set_warmup_iters(1);
  NF_ASSIGN_OR_RETURN(std::unique_ptr<launcher::Trainer> trainer,
                      launcher::Trainer::Create(config));
  parallel::LocalCommunicator world;
  fs::remove_all(dir, error);
  if (!error) fs::create_directories(dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot make a fresh --dir ", dir.string(), ": ", error.message()));
  }

  std::vector<double> save_s, load_s, first_snapshot_s, snapshot_s, dd_write_s, dd_read_s;
  std::vector<double> unreserved_snapshot_s;
  std::vector<double> step_alone_s, step_with_copy_s;
  int64_t bytes = 0, load_bytes = 0;
  for (int t = 0; t < trials; ++t) {
    const fs::path checkpoints = dir / absl::StrCat("save", t);
    auto start = std::chrono::steady_clock::now();
    NF_RETURN_IF_ERROR(checkpoint::SaveCheckpoint(checkpoints, trainer->CheckpointState(),
                                                  trainer->Progress(), world));
    save_s.push_back(Seconds(start));
    const fs::path saved = checkpoints / checkpoint::IterationDirName(trainer->step());
    bytes = DirectoryBytes(saved);

    DropCache(saved);
    start = std::chrono::steady_clock::now();
    NF_ASSIGN_OR_RETURN(const checkpoint::Manifest manifest, checkpoint::ReadManifest(saved));
    checkpoint::LoadStats stats;
    NF_RETURN_IF_ERROR(
        checkpoint::LoadCheckpoint(saved, manifest, trainer->CheckpointState(), &stats).status());
    load_s.push_back(Seconds(start));
    load_bytes = stats.bytes_read;

    // dd: the same bytes, one sequential stream, fsynced; then read back from the disk.
    const fs::path file = dir / absl::StrCat("dd", t);
    const int64_t mib = (bytes + (1 << 20) - 1) >> 20;
    const std::string write = absl::StrCat("dd if=/dev/zero of=", file.string(),
                                           " bs=1M count=", mib, " conv=fsync status=none");
    start = std::chrono::steady_clock::now();
    if (std::system(write.c_str()) != 0) return absl::InternalError("dd write failed");
    dd_write_s.push_back(Seconds(start));
    DropCache(file);
    const std::string read =
        absl::StrCat("dd if=", file.string(), " of=/dev/null bs=1M status=none");
    start = std::chrono::steady_clock::now();
    if (std::system(read.c_str()) != 0) return absl::InternalError("dd read failed");
    dd_read_s.push_back(Seconds(start));

    // Async: the loop is blocked for Start plus whatever the next step's optimizer update
    // waits for the snapshot copy, which runs beside that step's forward and backward. The
    // first save of a run copies into the buffer the run reserved at its start (nf-launch
    // calls Reserve after resuming; 5 steps run here before the save, many more in a run);
    // later ones reuse it, as periodic checkpointing does: the second is timed, and its step
    // against one without a save.
    // Also the first save of a saver that reserved nothing, as every run's was before
    // Reserve: it copies into fresh memory.
    {
      checkpoint::AsyncCheckpointer unreserved(dir / absl::StrCat("unreserved", t), {});
      start = std::chrono::steady_clock::now();
      NF_RETURN_IF_ERROR(unreserved.Start(trainer->CheckpointState(), trainer->Progress(), world));
      double blocked = Seconds(start);
      const double waited = trainer->state_reader_wait_seconds();
      NF_RETURN_IF_ERROR(trainer->TrainStep().status());
      blocked += trainer->state_reader_wait_seconds() - waited;
      unreserved_snapshot_s.push_back(blocked);
      NF_RETURN_IF_ERROR(unreserved.Finish(world));
      fs::remove_all(dir / absl::StrCat("unreserved", t), error);
    }
    checkpoint::AsyncCheckpointer saver(dir / absl::StrCat("async", t), {});
    saver.Reserve(trainer->CheckpointState());
    for (int step = 0; step < 5; ++step) NF_RETURN_IF_ERROR(trainer->TrainStep().status());
    for (int save = 0; save < 2; ++save) {
      NF_RETURN_IF_ERROR(saver.Finish(world));
      start = std::chrono::steady_clock::now();
      NF_RETURN_IF_ERROR(saver.Start(trainer->CheckpointState(), trainer->Progress(), world));
      double blocked = Seconds(start);
      const double waited = trainer->state_reader_wait_seconds();
      start = std::chrono::steady_clock::now();
      NF_RETURN_IF_ERROR(trainer->TrainStep().status());
      if (save == 1) step_with_copy_s.push_back(Seconds(start));
      blocked += trainer->state_reader_wait_seconds() - waited;
      (save == 0 ? first_snapshot_s : snapshot_s).push_back(blocked);
    }
    start = std::chrono::steady_clock::now();
    NF_RETURN_IF_ERROR(trainer->TrainStep().status());
    step_alone_s.push_back(Seconds(start));
    NF_RETURN_IF_ERROR(saver.Finish(world));
    fs::remove_all(checkpoints, error);
    fs::remove_all(dir / absl::StrCat("async", t), error);
    fs::remove(file, error);
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("checkpoint: %d parameters, %.3f GB per checkpoint, medians of %d trials\n",
              static_cast<int>(trainer->num_global_params()), gb, trials);
  std::printf("| operation | seconds | GB/s | vs dd |\n|---|---|---|---|\n");
  std::printf("| dd write (fsync) | %.3f | %.2f | 1.00 |\n", Median(dd_write_s),
              gb / Median(dd_write_s));
  std::printf("| save (sync) | %.3f | %.2f | %.2f |\n", Median(save_s), gb / Median(save_s),
              Median(dd_write_s) / Median(save_s));
  std::printf("| dd read (cold) | %.3f | %.2f | 1.00 |\n", Median(dd_read_s),
              gb / Median(dd_read_s));
  std::printf("| load (cold) | %.3f | %.2f | %.2f |\n", Median(load_s), gb / Median(load_s),
              Median(dd_read_s) / Median(load_s));
  std::printf(
      "| async save, first of a run, nothing reserved: loop blocked | %.3f | | %.2f of a "
      "sync save |\n",
      Median(unreserved_snapshot_s), Median(unreserved_snapshot_s) / Median(save_s));
  std::printf("| async save, first of a run: loop blocked | %.3f | | %.2f of a sync save |\n",
              Median(first_snapshot_s), Median(first_snapshot_s) / Median(save_s));
  std::printf("| async save, later ones: loop blocked | %.3f | | %.2f of a sync save |\n",
              Median(snapshot_s), Median(snapshot_s) / Median(save_s));
  std::printf("| training step (%d tokens) without a save | %.3f | | |\n", step_tokens,
              Median(step_alone_s));
  std::printf("| the same step, an async save's copy beside it | %.3f | | |\n",
              Median(step_with_copy_s));
  std::printf("the load read %lld of the checkpoint's %lld bytes\n",
              static_cast<long long>(load_bytes), static_cast<long long>(bytes));
  fs::remove_all(dir, error);
  return absl::OkStatus();
}

}  // namespace
}  // namespace nf::bench

int main(int argc, char** argv) {
  const absl::Status status = nf::bench::Run(argc, argv);
  if (!status.ok()) {
    std::fprintf(stderr, "nf-bench-checkpoint: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
