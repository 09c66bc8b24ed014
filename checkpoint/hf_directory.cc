#include "checkpoint/hf_directory.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/files/durable_files.h"
#include "core/json_value.h"
#include "core/status.h"

namespace nf::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr char kConfigName[] = "config.json";
constexpr char kSingleName[] = "model.safetensors";
constexpr char kIndexName[] = "model.safetensors.index.json";
// A model's config.json or shard index is kilobytes (a few megabytes for thousands of tensors):
// a JSON file far larger is not one, and is not read into memory.
constexpr uintmax_t kMaxJsonBytes = uintmax_t{64} << 20;

bool Exists(const fs::path& path) {
  std::error_code error;
  return fs::exists(fs::symlink_status(path, error));
}

// dir / name once it is known to be a regular file inside `dir`, symbolic links resolved.
absl::StatusOr<fs::path> FileInside(const fs::path& dir, const std::string& name) {
  const fs::path path = dir / name;
  std::error_code error;
  const fs::path root = fs::canonical(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", dir.string(), ": ", error.message()));
  }
  const fs::path resolved = fs::canonical(path, error);
  if (error) {
    return absl::NotFoundError(absl::StrCat(path.string(), " leads nowhere: ", error.message()));
  }
  const auto within = [&](const fs::path& top) {
    return std::mismatch(top.begin(), top.end(), resolved.begin(), resolved.end()).first ==
           top.end();
  };
  // The Hugging Face hub's cache keeps a revision as REPO/snapshots/REV/NAME, each a link to
  // ../../blobs/HASH: its files may lie in REPO/blobs too.
  const bool hub_snapshot = root.parent_path().filename() == "snapshots";
  if (!within(root) && !(hub_snapshot && within(root.parent_path().parent_path() / "blobs"))) {
    return absl::PermissionDeniedError(absl::StrCat(
        path.string(), " is a symbolic link to ", resolved.string(), ", outside ", dir.string(),
        ": an import reads only files inside the directory (copy the file there)"));
  }
  if (!fs::is_regular_file(resolved, error)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path.string(), " is not a regular file (a FIFO, device or directory)"));
  }
  return path;
}

// The text of a JSON file an import reads whole (config.json, the index).
absl::StatusOr<std::string> ReadJsonText(const fs::path& file) {
  std::error_code error;
  const uintmax_t size = fs::file_size(file, error);
  if (!error && size > kMaxJsonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.string(), " is ", size, " bytes: too large for a model's JSON file"));
  }
  return ReadWholeFile(file);
}

// The first file of `dir` (by name) that holds a pickle by its name, or empty.
std::string FirstPickle(const fs::path& dir) {
  std::set<std::string> pickles;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    for (const char* suffix : {".bin", ".pt", ".pth", ".ckpt", ".pkl"}) {
      if (absl::EndsWith(name, suffix)) pickles.insert(name);
    }
  }
  return pickles.empty() ? std::string() : *pickles.begin();
}

// model.safetensors.index.json as transformers writes it (other keys, which transformers
// ignores, are ignored too).
struct ShardIndex {
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::optional<uint64_t> total_size;             // metadata.total_size
};

absl::StatusOr<ShardIndex> ParseIndex(const JsonValue& json, const fs::path& file) {
  const auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(file.string(), ": ", what));
  };
  if (json.kind != JsonValue::Kind::kObject) return bad("not a JSON object");
  const auto map = json.members.find("weight_map");
  if (map == json.members.end() || map->second.kind != JsonValue::Kind::kObject) {
    return bad("\"weight_map\" must be an object mapping each tensor to its shard file");
  }
  ShardIndex index;
  for (const auto& [tensor, shard] : map->second.members) {
    if (shard.kind != JsonValue::Kind::kString) {
      return bad(absl::StrCat("\"weight_map\" maps ", JsonQuoted(tensor), " to ",
                              JsonKindName(shard.kind), ", not a file name"));
    }
    index.weight_map[tensor] = shard.text;
  }
  if (index.weight_map.empty()) return bad("\"weight_map\" names no tensor");
  const auto metadata = json.members.find("metadata");
  if (metadata == json.members.end()) return index;
  if (metadata->second.kind != JsonValue::Kind::kObject)
    return bad("\"metadata\" is not an object");
  const auto total = metadata->second.members.find("total_size");
  if (total == metadata->second.members.end()) return index;
  uint64_t bytes = 0;
  if (total->second.kind != JsonValue::Kind::kNumber ||
      !absl::SimpleAtoi(total->second.text, &bytes)) {
    return bad("\"metadata\".\"total_size\" is not a number of bytes");
  }
  index.total_size = bytes;
  return index;
}

// A shard name of the index is a file in the directory: named without any directory.
absl::Status CheckShardName(const std::string& shard, const std::string& tensor,
                            const fs::path& index_file) {
  absl::string_view what;
  if (shard.empty() || shard == "." || shard == "..") {
    what = "not a file name";
  } else if (shard.front() == '/') {
    what = "an absolute path";
  } else if (shard.find('/') != std::string::npos) {
    what = absl::StrContains(absl::StrCat("/", shard, "/"), "/../") ? "a path leading out"
                                                                    : "a path into a directory";
  } else if (shard.find('\0') != std::string::npos) {
    what = "a name with a NUL byte";
  } else {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      index_file.string(), ": weight_map maps ", tensor, " to ", JsonQuoted(shard), ", ", what,
      ": a shard is a file of the directory, named without any directory"));
}

// The shards the index names, opened, and which holds which tensor, checked against the index.
absl::Status OpenShards(const fs::path& dir, const fs::path& index_file, HfDirectory& out) {
  NF_ASSIGN_OR_RETURN(const std::string text, ReadJsonText(index_file));
  const absl::StatusOr<JsonValue> json = ParseJson(text);
  if (!json.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_file.string(), ": not JSON: ", json.status().message()));
  }
  NF_ASSIGN_OR_RETURN(const ShardIndex index, ParseIndex(*json, index_file));
  std::map<std::string, std::string> first_tensor;  // shard -> the first tensor mapped to it
  for (const auto& [tensor, shard] : index.weight_map) first_tensor.emplace(shard, tensor);
  // Every name is checked before any file is opened.
  for (const auto& [shard, tensor] : first_tensor) {
    NF_RETURN_IF_ERROR(CheckShardName(shard, tensor, index_file));
  }
  std::map<std::string, size_t> file_of;  // shard name -> its place in out.files
  for (const auto& [shard, tensor] : first_tensor) {
    if (!Exists(dir / shard)) {
      return absl::NotFoundError(absl::StrCat((dir / shard).string(), " is missing: ",
                                              index_file.string(), " maps ", tensor, " to it"));
    }
    NF_ASSIGN_OR_RETURN(const fs::path path, FileInside(dir, shard));
    NF_ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
    file_of[shard] = out.files.size();
    out.files.push_back(std::move(reader));
  }
  uint64_t bytes = 0;
  for (const auto& [shard, i] : file_of) {
    for (const SafetensorsEntry& entry : out.files[i].entries()) {
      const auto mapped = index.weight_map.find(entry.name);
      if (mapped == index.weight_map.end() || mapped->second != shard) {
        return absl::DataLossError(absl::StrCat(
            out.files[i].file().string(), " holds ", entry.name, ", which ", index_file.string(),
            mapped == index.weight_map.end() ? " does not list"
                                             : absl::StrCat(" maps to ", mapped->second)));
      }
      out.tensors[entry.name] = i;
      bytes += static_cast<uint64_t>(NumElements(entry.shape)) * SizeOf(entry.dtype);
    }
  }
  for (const auto& [tensor, shard] : index.weight_map) {
    if (out.tensors.count(tensor) == 0) {
      return absl::DataLossError(absl::StrCat(index_file.string(), " maps ", tensor, " to ", shard,
                                              ", which does not hold it"));
    }
  }
  if (index.total_size && *index.total_size != bytes) {
    return absl::DataLossError(absl::StrCat(index_file.string(), ": metadata.total_size is ",
                                            *index.total_size, ", but its shards hold ", bytes,
                                            " bytes of tensors"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HfDirectory> OpenHfDirectory(const fs::path& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    return absl::NotFoundError(absl::StrCat(dir.string(), " is not a directory"));
  }
  HfDirectory out;
  if (!Exists(dir / kConfigName)) {
    return absl::NotFoundError(absl::StrCat(dir.string(), " has no ", kConfigName,
                                            ": not a Hugging Face model directory"));
  }
  NF_ASSIGN_OR_RETURN(out.config_file, FileInside(dir, kConfigName));
  NF_ASSIGN_OR_RETURN(out.config_json, ReadJsonText(out.config_file));
  const bool single = Exists(dir / kSingleName), sharded = Exists(dir / kIndexName);
  if (single && sharded) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir.string(), " holds both ", kSingleName, " and ", kIndexName,
                     ": which are the weights is unclear; remove the stale one"));
  }
  if (single) {
    out.weights = (dir / kSingleName).string();
    NF_ASSIGN_OR_RETURN(const fs::path path, FileInside(dir, kSingleName));
    NF_ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
    for (const SafetensorsEntry& entry : reader.entries()) out.tensors[entry.name] = 0;
    out.files.push_back(std::move(reader));
    return out;
  }
  if (sharded) {
    out.weights = absl::StrCat("the shards of ", (dir / kIndexName).string());
    NF_ASSIGN_OR_RETURN(const fs::path index_file, FileInside(dir, kIndexName));
    NF_RETURN_IF_ERROR(OpenShards(dir, index_file, out));
    return out;
  }
  if (const std::string pickle = FirstPickle(dir); !pickle.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir.string(), " holds ", pickle, ", a pickle, and no ", kSingleName,
        ": pickles are never loaded (unpickling runs code); convert it where you trust it, with "
        "safetensors' own tools or transformers (from_pretrained, then save_pretrained)"));
  }
  return absl::NotFoundError(
      absl::StrCat(dir.string(), " has no ", kSingleName, " or ", kIndexName));
}

}  // namespace nf::checkpoint
