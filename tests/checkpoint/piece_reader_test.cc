// A rank reads only the pieces that hold its elements: for each rank of a tensor-parallel
// layout, the bytes read are exactly those of the pieces it needs (its own tp rank's and the
// replicated ones), and what it reads equals the shard cut from the whole tensor.
#include <cstdint>
#include <filesystem>
#include <vector>

#include "assert_ok.h"
#include "checkpoint/assemble.h"
#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/convert.h"
#include "checkpoint/piece_reader.h"
#include "checkpoint/shard_mapping.h"
#include "gtest/gtest.h"
#include "training_test_util.h"

namespace nf::checkpoint {
namespace {

using ::nf::testing::Bytes;
using ::nf::testing::MakeTrainer;
using ::nf::testing::TrainSteps;

// The parameter a record describes, as a run of any layout declares it.
model::ParamSpec SpecOf(const TensorRecord& record) {
  model::ParamSpec spec;
  spec.name = record.name();
  spec.global_shape.assign(record.global_shape().begin(), record.global_shape().end());
  spec.sharding = ShardingFromProto(record.pieces(0).sharding());
  return spec;
}

TEST(PieceReaderTest, EachTensorParallelRankReadsExactlyItsPieces) {
  TempDir dir;
  auto trainer = MakeTrainer(TinyConfig(launcher::TrainOptions::FP32));
  TrainSteps(*trainer, 2);
  NF_ASSERT_OK(Save(*trainer, dir.path() / "checkpoints"));  // the conversion goes beside it
  const fs::path saved = dir.path() / "checkpoints" / "iter_0000002", tp2 = dir.path() / "tp2";
  NF_ASSERT_OK(ConvertCheckpoint(saved, *ReadManifest(saved), {.tensor_parallel = 2}, tp2));
  const Manifest manifest = *ReadManifest(tp2);
  int64_t checkpoint_bytes = 0;
  for (const ShardFile& f : manifest.files()) checkpoint_bytes += f.size();
  for (int tp_rank = 0; tp_rank < 2; ++tp_rank) {
    ShardReader reader(tp2);
    int64_t needed = 0;  // the bytes of the pieces this rank needs, from the manifest alone
    for (const TensorRecord& record : manifest.tensors()) {
      const model::ParamSpec spec = SpecOf(record);
      for (const Piece& p : record.pieces()) {
        if (p.tp_size() == 1 || p.tp_rank() == tp_rank) needed += p.length();
      }
      const CheckedRecord checked = *CheckRecord(tp2, manifest, record);
      const int64_t local_numel =
          NumElements(LocalShape(spec.global_shape, PlaceOf(spec, tp_rank, 2)));
      const Tensor shard = *Tensor::HostZeros(checked.dtype, {local_numel});
      NF_ASSERT_OK(ReadParameterShard(reader, manifest, record, spec, tp_rank, 2, shard));
      const AssembledTensor whole = *AssembleTensor(tp2, manifest, record);
      EXPECT_EQ(Bytes(shard), Bytes(*CutShard(tp2, whole, spec, local_numel, tp_rank, 2)))
          << record.name();
    }
    EXPECT_EQ(reader.bytes_read(), needed) << "tp rank " << tp_rank;
    EXPECT_LT(reader.bytes_read(), checkpoint_bytes);
  }

  // One process needs every piece but those of the padding rows tp 2 added to the vocabulary
  // table (128 x tp rows: tp rank 1's 128 of 256 rows hold no row of the 40-token vocabulary,
  // padded to 128 on one process).
  int64_t padding_bytes = 0;
  for (const TensorRecord& record : manifest.tensors()) {
    if (!IsVocabularyTable(record.name())) continue;
    for (const Piece& p : record.pieces()) {
      if (p.tp_rank() == 1) padding_bytes += p.length();
    }
  }
  auto loaded = MakeTrainer(TinyConfig(launcher::TrainOptions::FP32));
  LoadStats stats;
  NF_ASSERT_OK(LoadCheckpoint(tp2, manifest, loaded->CheckpointState(), &stats).status());
  EXPECT_GT(padding_bytes, 0);
  EXPECT_EQ(stats.bytes_read, checkpoint_bytes - padding_bytes);
  EXPECT_EQ(Bytes(trainer->chunks().front()->params().params()),
            Bytes(loaded->chunks().front()->params().params()));
}

}  // namespace
}  // namespace nf::checkpoint
