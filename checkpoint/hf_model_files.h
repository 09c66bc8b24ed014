// The project's own transformers model files (checkpoint/hf/*.py), embedded into the programs
// at build time (checkpoint/CMakeLists.txt), which the Hugging Face export writes beside a
// "normformer" model's config.json for trust_remote_code to load.
#pragma once

#include <span>
#include <string_view>

namespace nf::checkpoint {

struct HfModelFile {
  std::string_view name;      // "modeling_normformer.py"
  std::string_view contents;  // the file's bytes
};

std::span<const HfModelFile> HfModelFiles();

}  // namespace nf::checkpoint
