// The names a run's checkpoints directory is made of: what training writes there, and what the
// tools recognise as a checkpoint (checkpoint/output_path.h) without reading protobuf, so that
// programs which must not load it (nf-preprocess, beside SentencePiece's own copy) can check
// their outputs too.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace nf::checkpoint {

inline constexpr char kManifestName[] = "manifest.pb";
inline constexpr char kLatestName[] = "latest";

// "iter_0000200".
std::string IterationDirName(int64_t step);
// The step an iteration directory's name stands for ("iter_0000200": 200); false for any other
// name (a .tmp staging directory, a copy under another name).
bool ParseIterationDirName(const std::string& name, int64_t& step);
// The steps of the iteration directories in `checkpoints_dir` (named as IterationDirName names,
// whatever they hold), ascending; empty when there are none or the directory does not exist.
// Counting checkpoints, use CheckpointSteps (load.h): an empty or half-copied directory under a
// checkpoint's name is not one.
std::vector<int64_t> IterationDirSteps(const std::filesystem::path& checkpoints_dir);

}  // namespace nf::checkpoint
