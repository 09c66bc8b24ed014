// Writes valid manifests into the directory given, the seeds of manifest_reader_fuzzer, each as
// a whole manifest.pb and as its bare payload: one shard file or two, replicated and
// tensor-parallel pieces, every dtype a checkpoint holds.
#include <cstdint>
#include <fstream>
#include <iostream>
#include <string>

#include "checkpoint/manifest_file.h"

namespace {

using nf::checkpoint::Manifest;

// A record of `kind` for a [rows, cols] tensor of `dtype` (element_bytes each), its pieces
// appended to `file` (whose size grows by their bytes).
void AddRecord(Manifest& m, const std::string& name, nf::checkpoint::TensorRecord::Kind kind,
               const char* dtype, int64_t element_bytes, int64_t rows, int64_t cols, int tp,
               nf::checkpoint::ShardFile& file) {
  nf::checkpoint::TensorRecord* r = m.add_tensors();
  r->set_name(name);
  r->set_kind(kind);
  r->add_global_shape(rows);
  r->add_global_shape(cols);
  r->set_dtype(dtype);
  for (int rank = 0; rank < tp; ++rank) {
    nf::checkpoint::Piece* p = r->add_pieces();
    const int64_t elements = rows * cols / tp;
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
  m.mutable_model()->set_num_layers(1);
  m.set_train_config("train { seed: 1 }");
  for (int f = 0; f < files; ++f) {
    nf::checkpoint::ShardFile* file = m.add_files();
    file->set_name("rank_0000" + std::to_string(f) + ".shard");
    file->set_size(0);
    file->set_world_rank(f);
    using Kind = nf::checkpoint::TensorRecord;
    AddRecord(m, "decoder.layers.0.fc1.weight", Kind::PARAM, f == 0 ? "f16" : "bf16", 2, 4, 2, tp,
              *file);
    AddRecord(m, "decoder.layers.0.fc1.weight", Kind::MASTER, "f32", 4, 4, 2, tp, *file);
    AddRecord(m, "decoder.layer_norm.weight", Kind::EXP_AVG_SQ, "f32", 4, 1, 3, 1, *file);
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
    if (!nf::checkpoint::ValidateManifest(m, "seed").ok()) {
      std::cerr << "make_manifest_seeds: seed " << written << " is not valid\n";
      return 1;
    }
    const std::string seed = std::string(argv[1]) + "/seed_" + std::to_string(written++);
    std::ofstream(seed + ".pb", std::ios::binary) << nf::checkpoint::EncodeManifest(m);
    std::ofstream(seed + ".payload", std::ios::binary) << m.SerializeAsString();
  }
  return 0;
}
