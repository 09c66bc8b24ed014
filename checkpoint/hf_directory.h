// The files of a Hugging Face model directory that `nf-ckpt import` reads, and nothing else:
// config.json and the weights as safetensors, either model.safetensors or the shards that
// model.safetensors.index.json names. Pickles (pytorch_model.bin, *.bin, *.pt, *.pth, *.ckpt)
// are never opened, since unpickling runs code, and neither is any .py: the import computes the
// model from config.json alone.
//
// Every file read is a regular file inside the directory: a shard name is a plain file name (no
// '/', no ".."), and a symbolic link may lead only to a file inside the directory (or, for a
// revision in the Hugging Face hub's cache, REPO/snapshots/REV, to REPO/blobs). A directory
// comes from elsewhere; its links are its author's, and an import must not read what lies
// elsewhere on this machine (and publish it again as a model).
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/safetensors_file.h"

namespace nf::checkpoint {

struct HfDirectory {
  std::filesystem::path config_file;  // DIR/config.json
  std::string config_json;            // its text
  // "DIR/model.safetensors", or "the shards of DIR/model.safetensors.index.json": for messages.
  std::string weights;
  // model.safetensors, or the index's shards in name order, each opened (header checked).
  std::vector<SafetensorsReader> files;
  std::map<std::string, size_t> tensors;  // every tensor of the files -> its file in `files`
};

// Refused, with one line naming the file (and the tensor or shard): no config.json; no
// safetensors weights (a directory with only pickles is told how to convert them); both
// model.safetensors and an index; a file outside the directory or not a regular file; an index
// that is not {"weight_map": {tensor: file}, "metadata": {"total_size": bytes}?}, names a
// missing or damaged shard, maps a tensor to a file that does not hold it, leaves out a tensor a
// shard holds, or states a total_size other than the shards' tensor bytes.
absl::StatusOr<HfDirectory> OpenHfDirectory(const std::filesystem::path& dir);

}  // namespace nf::checkpoint
