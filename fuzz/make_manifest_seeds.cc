// Writes valid manifests into the directory given, the seeds of manifest_reader_fuzzer, each as
// a whole manifest.pb and as its bare payload: one shard file or two, replicated and
// tensor-parallel pieces, every dtype a checkpoint holds, tensors that are the model's.
#include <cstdint>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint/manifest_file.h"

namespace {

using nf::checkpoint::Manifest;

// A record of `kind` for a tensor of `shape` ([rows] or [rows, cols]) and `dtype` (element_bytes
// each), its pieces appended to `file` (whose size grows by their bytes).
void AddRecord(Manifest& m, const std::string& name, nf::checkpoint::TensorRecord::Kind kind,
               const char* dtype, int64_t element_bytes, std::vector<int64_t> shape, int tp,
               nf::checkpoint::ShardFile& file) {
  nf::checkpoint::TensorRecord* r = m.add_tensors();
  r->set_name(name);
  r->set_kind(kind);
  int64_t numel = 1;
  for (const int64_t dim : shape) {
    r->add_global_shape(dim);
    numel *= dim;
  }
  r->set_dtype(dtype);
  for (int rank = 0; rank < tp; ++rank) {
    nf::checkpoint::Piece* p = r->add_pieces();
    const int64_t elements = numel / tp;
    p->set_file(file.name());
    p->set_offset(file.size());
    p->set_length(elements * element_bytes);
    p->set_crc32c(0x12345678u + rank);
    p->set_sharding(tp == 1 ? nf::checkpoint::REPLICATED : nf::checkpoint::SPLIT_ROWS);
    p->set_tp_rank(rank);
    p->set_tp_size(tp);
    p->set_begin(0);
    p->set_end(elements);
    file.set_size(file.size() + p->length());
  }
}

Manifest Seed(int files, int tp) {
  Manifest m;
  m.set_format_version(nf::checkpoint::kFormatVersion);
  m.set_step(12);
  m.set_consumed_samples(96);
  m.set_data_stream_samples(800);
  m.set_optimizer_updates(12);
  // A model whose parameters the records below are (decode checks names and shapes).
  nf::model::ModelConfig& model = *m.mutable_model();
  model.set_num_layers(1);
  model.set_d_model(2);
  model.set_num_heads(1);
  model.set_ffn_dim(4);
  model.set_vocab_size(8);
  model.set_max_seq_len(4);
  m.set_train_config("train { seed: 1 }");
  for (int f = 0; f < files; ++f) {
    nf::checkpoint::ShardFile* file = m.add_files();
    file->set_name("rank_0000" + std::to_string(f) + ".shard");
    file->set_size(0);
    file->set_world_rank(f);
    using Kind = nf::checkpoint::TensorRecord;
    AddRecord(m, "decoder.layers.0.fc1.weight", Kind::PARAM, f == 0 ? "f16" : "bf16", 2, {4, 2}, tp,
              *file);
    AddRecord(m, "decoder.layers.0.fc1.weight", Kind::MASTER, "f32", 4, {4, 2}, tp, *file);
    AddRecord(m, "decoder.layer_norm.weight", Kind::EXP_AVG_SQ, "f32", 4, {2}, 1, *file);
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_manifest_seeds DIR\n";
    return 2;
  }
  int written = 0;
  for (const auto& [files, tp] : {std::pair{1, 1}, std::pair{2, 2}, std::pair{1, 4}}) {
    const Manifest m = Seed(files, tp);
    // Valid as every reader decodes it: structure, model config, and the tensors it gives.
    if (const absl::Status valid =
            nf::checkpoint::DecodeManifest(nf::checkpoint::EncodeManifest(m), "seed").status();
        !valid.ok()) {
      std::cerr << "make_manifest_seeds: seed " << written << " is not valid: " << valid << "\n";
      return 1;
    }
    const std::string seed = std::string(argv[1]) + "/seed_" + std::to_string(written++);
    std::ofstream(seed + ".pb", std::ios::binary) << nf::checkpoint::EncodeManifest(m);
    std::ofstream(seed + ".payload", std::ios::binary) << m.SerializeAsString();
  }
  return 0;
}
