// Sharded optimizer state (Note [Sharded optimizer state]): saved by 2 or 3 ranks (threads of this
// process, tests/unit/train/thread_ranks.h) and loaded back at another rank count, sliced or
// whole, to the bit; the checks on coverage and metadata; the chunk bound; consolidation.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../data/temp_dir.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/durable_file.h"
#include "comm/self_communicator.h"
#include "model/models.h"
#include "sharded_state.h"
#include "thread_ranks.h"
#include "train/checkpointer.h"
#include "train/optimizer_transfer.h"
#include "train/root_broadcast.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using checkpoint::Piece;
using testing::full_state;
using testing::slice_of;

std::unique_ptr<Sequential> tiny_model() {
  ModelSpec spec;
  spec.hidden = {4};
  spec.memory_budget_bytes = 1 << 30;
  return build_model(spec, {1, 2, 2}, 3, Device::cpu(), 5);
}

checkpoint::TrainingState state_at(int64_t step, int world) {
  checkpoint::TrainingState s;
  s.global_step = step;
  s.world_size = world;
  s.config = {{"x", 1}};
  return s;
}

// n ranks save `full` at step 10: sliced (ZeRO) when `sliced`, else whole (as today).
void save(const std::string& dir, const OptimizerState& full, int n, bool sliced, size_t chunk = 40) {
  testing::run_ranks(n, [&](Communicator& comm) {
    auto model = tiny_model();
    testing::FixedStateOptimizer opt(sliced ? slice_of(full, comm.rank(), n) : full);
    Checkpointer saver(comm, {.dir = dir, .background = false, .transfer_chunk_bytes = chunk});
    saver.save(state_at(10, n), *model, opt);
    saver.finish();
  });
}

// What each of m ranks imports from `dir`: its slices (ZeRO) or every tensor whole.
std::vector<OptimizerState> load(const std::string& dir, const OptimizerState& full, int m, bool sliced) {
  std::vector<OptimizerState> got(static_cast<size_t>(m));
  testing::run_ranks(m, [&](Communicator& comm) {
    auto model = tiny_model();
    testing::FixedStateOptimizer opt;
    WantedPieces pieces;
    if (sliced) pieces = testing::pieces_of(full, comm.rank(), m);
    auto resumed = restore_newest(comm, dir, *model, opt, nullptr, pieces);
    ASSERT_TRUE(resumed.has_value());
    got[static_cast<size_t>(comm.rank())] = opt.state();
  });
  return got;
}

void expect_loaded(const std::string& dir, const OptimizerState& full, int m, bool sliced) {
  const std::vector<OptimizerState> got = load(dir, full, m, sliced);
  for (int r = 0; r < m; ++r)
    EXPECT_EQ(testing::state_difference(got[static_cast<size_t>(r)], sliced ? slice_of(full, r, m) : full), "")
        << "rank " << r << " of " << m;
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(ShardedCheckpoint, ThreeShardsLoadAtTwoRanksBitwise) {
  testing::TempDir tmp;
  const std::string dir = (tmp.path() / "ck").string();
  const OptimizerState full = full_state();
  save(dir, full, 3, true);
  EXPECT_EQ(entries(fs::path(dir) / "step-10"),
            (std::vector<std::string>{"model.safetensors", "optimizer-rank0-of-3.safetensors",
                                      "optimizer-rank1-of-3.safetensors", "optimizer-rank2-of-3.safetensors",
                                      "state.json"}));
  const checkpoint::LoadedCheckpoint c = checkpoint::read_checkpoint(dir);
  EXPECT_EQ(c.state.optimizer_shards, 3);
  EXPECT_TRUE(c.optimizer.sharded());
  // The slices keep PyTorch's names; each file says where its pieces belong.
  const safetensors::File shard1 = safetensors::read_file((fs::path(dir) / "step-10/optimizer-rank1-of-3.safetensors").string());
  const Piece p1 = testing::pieces_of(full, 1, 3).front();
  EXPECT_EQ(shard1.metadata().at(p1.name), checkpoint::encode_piece(p1));
  EXPECT_EQ(shard1.metadata().at("optimizer"), "adamw");
  expect_loaded(dir, full, 2, true);
}

TEST(ShardedCheckpoint, TwoShardsLoadWholeAtOneAndThreeRanks) {
  testing::TempDir tmp;
  const std::string dir = (tmp.path() / "ck").string();
  const OptimizerState full = full_state(2);
  save(dir, full, 2, true);
  expect_loaded(dir, full, 1, false);  // without ZeRO: the whole tensors, assembled
  expect_loaded(dir, full, 3, false);
  expect_loaded(dir, full, 2, true);   // the same world size
}

// A ZeRO rank that owns whole parameters exports them whole, and only those: the ranks' exports
// differ, so the state is saved in shards although no entry is a slice.
TEST(ShardedCheckpoint, RanksExportingDifferentWholeTensorsSaveShards) {
  testing::TempDir tmp;
  const std::string dir = (tmp.path() / "ck").string();
  const OptimizerState full = full_state(6);
  testing::run_ranks(2, [&](Communicator& comm) {
    OptimizerState mine;  // rank 0: the biases and 0.weight, rank 1: 2.weight
    for (const auto& e : full.tensors)
      if ((e.name.starts_with("2.") ? 1 : 0) == comm.rank()) mine.tensors.push_back(e);
    for (const auto& c : full.counts)
      if ((c.name.starts_with("2.") ? 1 : 0) == comm.rank()) mine.counts.push_back(c);
    auto model = tiny_model();
    testing::FixedStateOptimizer opt(mine);
    Checkpointer saver(comm, {.dir = dir, .background = false});
    saver.save(state_at(10, 2), *model, opt);
  });
  EXPECT_EQ(checkpoint::read_checkpoint(dir).state.optimizer_shards, 2);
  expect_loaded(dir, full, 1, false);
  expect_loaded(dir, full, 3, true);
}

TEST(ShardedCheckpoint, AnUnshardedCheckpointLoadsAsThreeSlices) {
  testing::TempDir tmp;
  const std::string dir = (tmp.path() / "ck").string();
  const OptimizerState full = full_state(3);
  save(dir, full, 2, false);  // whole tensors: the files of today
  EXPECT_EQ(entries(fs::path(dir) / "step-10"),
            (std::vector<std::string>{"model.safetensors", "optimizer.safetensors", "state.json"}));
  EXPECT_EQ(checkpoint::read_checkpoint(dir).state.optimizer_shards, 1);
  expect_loaded(dir, full, 3, true);
  expect_loaded(dir, full, 1, false);
}

// pytorch#68181: no rank holds more than its slice and one chunk. Every collective that carries
// tensor bytes carries at most the chunk.
TEST(ShardedCheckpoint, NoChunkExceedsTheBound) {
  testing::TempDir tmp;
  const std::string dir = (tmp.path() / "ck").string();
  const OptimizerState full = full_state();
  save(dir, full, 3, true);
  const size_t chunk = 24;
  std::vector<TransferStats> stats(3);
  testing::run_ranks(3, [&](Communicator& comm) {
    std::optional<checkpoint::LoadedCheckpoint> c;
    if (comm.rank() == 0) c = checkpoint::read_checkpoint(dir);
    receive_optimizer_state(comm, c ? &c->optimizer : nullptr, std::nullopt, chunk, &stats[static_cast<size_t>(comm.rank())]);
  });
  EXPECT_LE(stats[0].largest_chunk, chunk);
  EXPECT_GT(stats[0].chunks, 6);  // tensors of up to 140 bytes went in several chunks
  EXPECT_EQ(stats[0].bytes, 2u * (3 + 35 + 20) * 4);
  // Saving: ranks 1 and 2 send their slices to rank 0 in chunks of at most the bound.
  std::vector<TransferStats> sent(3);
  testing::run_ranks(3, [&](Communicator& comm) {
    std::unique_ptr<checkpoint::ShardedSave> save;
    if (comm.rank() == 0) save = std::make_unique<checkpoint::ShardedSave>(
        checkpoint::CheckpointWriterOptions{.dir = tmp.path() / "send", .keep = 2, .fault_after_bytes = std::nullopt}, 3, 3);
    send_optimizer_shards(comm, slice_of(full, comm.rank(), 3), {{"optimizer", "adamw"}}, save.get(), chunk,
                          &sent[static_cast<size_t>(comm.rank())]);
  });
  for (const TransferStats& s : sent) EXPECT_LE(s.largest_chunk, chunk);
  EXPECT_GT(sent[0].chunks, 6);
  uint64_t rank0_bytes = 0;  // rank 0's own slice never moves
  for (const auto& e : slice_of(full, 0, 3).tensors) rank0_bytes += e.value.nbytes();
  EXPECT_EQ(sent[0].bytes, 2u * (3 + 35 + 20) * 4 - rank0_bytes);
}

// Rank 0 failing to write (here: its temporary directory vanished) keeps moving every chunk, then
// the failure is every rank's: no rank is left waiting on another.
TEST(ShardedCheckpoint, ARank0WriteFailureIsEveryRanksErrorWithoutAHang) {
  testing::TempDir tmp;
  const OptimizerState full = full_state();
  std::vector<std::string> errors(3);
  testing::run_ranks(3, [&](Communicator& comm) {
    std::unique_ptr<checkpoint::ShardedSave> save;
    if (comm.rank() == 0) {
      save = std::make_unique<checkpoint::ShardedSave>(
          checkpoint::CheckpointWriterOptions{.dir = tmp.path(), .keep = 2, .fault_after_bytes = std::nullopt}, 3, 3);
      fs::remove_all(save->temp());
    }
    try {
      send_optimizer_shards(comm, slice_of(full, comm.rank(), 3), {}, save.get(), 24);
    } catch (const AgreedError& e) {
      errors[static_cast<size_t>(comm.rank())] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("optimizer-rank0-of-3.safetensors"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], errors[0]);
  EXPECT_EQ(errors[2], errors[0]);
}

// Writes rank states as shard files of one checkpoint directly (no ranks), letting a test edit
// each file's metadata first: how damaged checkpoints are made.
void write_shards(const fs::path& dir, const std::vector<OptimizerState>& ranks,
                  const std::function<void(int, safetensors::Metadata&)>& edit = {}) {
  const checkpoint::CheckpointWriterOptions options{.dir = dir, .keep = 2, .fault_after_bytes = std::nullopt};
  checkpoint::CheckpointSnapshot snapshot;
  snapshot.state = state_at(10, static_cast<int>(ranks.size()));
  snapshot.state.rng = {{"dropout_counters", nlohmann::json::array()}};
  const auto model = tiny_model();
  for (Parameter* p : model->parameters()) snapshot.model.push_back(safetensors::host_copy(p->name, p->value));
  const int n = static_cast<int>(ranks.size());
  snapshot.sharded = std::make_shared<checkpoint::ShardedSave>(options, 10, n);
  for (int r = 0; r < n; ++r) {
    const checkpoint::ShardManifest m = shard_manifest(ranks[static_cast<size_t>(r)], {{"optimizer", "adamw"}});
    safetensors::Metadata meta = m.file_metadata();
    if (edit) edit(r, meta);
    const std::string name = checkpoint::optimizer_shard_name(r, n);
    auto file = snapshot.sharded->create(name);
    const auto specs = m.specs();
    safetensors::write_header(*file, specs, meta);
    for (size_t i : safetensors::data_order(specs)) {
      if (i >= m.tensors.size()) {
        const int64_t v = m.counts[i - m.tensors.size()].value;
        file->write(std::as_bytes(std::span(&v, 1)));
      } else {
        const Tensor& t = ranks[static_cast<size_t>(r)].tensors[i].value;
        file->write({static_cast<const std::byte*>(t.raw()), t.nbytes()});
      }
    }
    file->commit();
    snapshot.sharded->add(name, *file);
  }
  checkpoint::write_checkpoint(options, snapshot);
}

std::string open_error(const fs::path& dir) {
  try {
    checkpoint::read_checkpoint(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

std::vector<OptimizerState> three_slices(const OptimizerState& full) {
  return {slice_of(full, 0, 3), slice_of(full, 1, 3), slice_of(full, 2, 3)};
}

TEST(ShardedCheckpoint, DirectlyWrittenShardsReadBack) {
  testing::TempDir tmp;
  write_shards(tmp.path(), three_slices(full_state()));
  EXPECT_EQ(open_error(tmp.path()), "no error");
  expect_loaded(tmp.path().string(), full_state(), 1, false);
}

TEST(ShardedCheckpoint, AMissingPieceIsOneLineNamingTheFileAndTensor) {
  testing::TempDir tmp;
  std::vector<OptimizerState> ranks = three_slices(full_state());
  const std::string lost = ranks[1].tensors.back().name;  // a piece rank 1 never saved
  ranks[1].tensors.pop_back();
  write_shards(tmp.path(), ranks);
  const std::string e = open_error(tmp.path());
  EXPECT_NE(e.find("tensor '" + lost + "': elements ["), std::string::npos) << e;
  EXPECT_NE(e.find("are in no shard file"), std::string::npos) << e;
  EXPECT_NE(e.find("optimizer-rank"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST(ShardedCheckpoint, AnOverlapIsOneLineNamingBothFiles) {
  testing::TempDir tmp;
  std::vector<OptimizerState> ranks = three_slices(full_state());
  OptimizerState::Entry& first = ranks[2].tensors.front();  // starts where rank 1's piece ends
  ASSERT_GT(first.offset, 0);
  first.offset -= 1;  // now one element is in two files (and the last one in none: reported first?)
  write_shards(tmp.path(), ranks);
  const std::string e = open_error(tmp.path());
  EXPECT_NE(e.find("optimizer-rank2-of-3.safetensors: tensor '" + first.name + "': elements ["), std::string::npos) << e;
  EXPECT_NE(e.find("are also in"), std::string::npos) << e;
  EXPECT_NE(e.find("optimizer-rank1-of-3.safetensors"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST(ShardedCheckpoint, MetadataThatDoesNotParseIsOneLine) {
  testing::TempDir tmp;
  const std::string name = slice_of(full_state(), 0, 3).tensors.front().name;
  write_shards(tmp.path(), three_slices(full_state()), [&](int r, safetensors::Metadata& m) {
    if (r == 0) m[name] = "0,2";
  });
  const std::string e = open_error(tmp.path());
  EXPECT_NE(e.find("optimizer-rank0-of-3.safetensors: tensor '" + name + "': __metadata__ has '0,2'"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST(ShardedCheckpoint, ADamagedShardIsACheckpointErrorOnEveryRank) {
  testing::TempDir tmp;
  std::vector<OptimizerState> ranks = three_slices(full_state());
  ranks[0].tensors.pop_back();
  write_shards(tmp.path(), ranks);
  std::vector<std::string> errors(2);
  testing::run_ranks(2, [&](Communicator& comm) {
    auto model = tiny_model();
    testing::FixedStateOptimizer opt;
    try {
      restore_newest(comm, tmp.path().string(), *model, opt);
    } catch (const AgreedError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCheckpoint);
      errors[static_cast<size_t>(comm.rank())] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("are in no shard file"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[0], errors[1]);
}

TEST(ShardedCheckpoint, APieceOfAnotherShapeIsRefused) {
  testing::TempDir tmp;
  const std::string dir = (tmp.path() / "ck").string();
  const OptimizerState full = full_state();
  save(dir, full, 2, true);
  SelfCommunicator comm;
  auto model = tiny_model();
  testing::FixedStateOptimizer opt;
  try {
    restore_newest(comm, dir, *model, opt, nullptr, std::vector<Piece>{{"0.weight.exp_avg", 0, 10, {7, 5}}});
    FAIL() << "no error";
  } catch (const AgreedError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("optimizer-rank0-of-2.safetensors: tensor '0.weight.exp_avg' is [5, 7], rank 0's optimizer "
                        "wants elements [0, 10) of a [7, 5]"),
              std::string::npos)
        << what;
  }
}

// Each rank checks its own slices before a save (no rank holds the others'): a NaN in rank 1's is
// every rank's error, naming its shard, and nothing of the step is written.
TEST(ShardedCheckpoint, ANonFiniteSliceOnAnyRankStopsTheSaveOnEveryRank) {
  testing::TempDir tmp;
  const std::string dir = (tmp.path() / "ck").string();
  const OptimizerState full = full_state();
  std::vector<std::string> errors(2);
  testing::run_ranks(2, [&](Communicator& comm) {
    auto model = tiny_model();
    OptimizerState mine = slice_of(full, comm.rank(), 2);
    if (comm.rank() == 1) mine.tensors.back().value.data()[2] = std::numeric_limits<float>::quiet_NaN();
    testing::FixedStateOptimizer opt(mine);
    Checkpointer saver(comm, {.dir = dir, .background = true});
    try {
      saver.save(state_at(10, 2), *model, opt);
    } catch (const AgreedError& e) {
      errors[static_cast<size_t>(comm.rank())] = e.what();
    }
    saver.finish();
  });
  const std::string name = slice_of(full, 1, 2).tensors.back().name;
  EXPECT_EQ(errors[0], dir + "/step-10: not saved: optimizer-rank1-of-2.safetensors: " + name +
                           ": 1 non-finite value(s) (first: nan at index 2)");
  EXPECT_EQ(errors[1], errors[0]);
  EXPECT_EQ(entries(dir), std::vector<std::string>{});  // no step-10, no .tmp-*, the lock let go
}

TEST(ShardedCheckpoint, ConsolidateWritesTheBytesOfTheUnshardedSave) {
  testing::TempDir tmp;
  const OptimizerState full = full_state(4);
  save((tmp.path() / "whole").string(), full, 1, false);
  save((tmp.path() / "sharded").string(), full, 3, true);
  const checkpoint::LoadedCheckpoint c = checkpoint::read_checkpoint(tmp.path() / "sharded");
  const std::string out = (tmp.path() / "consolidated.safetensors").string();
  checkpoint::consolidate(c.optimizer, out, 12);
  const std::string want = bytes_of(tmp.path() / "whole/step-10/optimizer.safetensors");
  EXPECT_FALSE(want.empty());
  EXPECT_TRUE(bytes_of(out) == want) << "the consolidated file differs from the unsharded optimizer.safetensors";
}

TEST(ShardedCheckpoint, PieceMetadataRoundTripsAndRejectsMalformedText) {
  const Piece p{"x", 3, 5, {2, 4}};
  EXPECT_EQ(checkpoint::encode_piece(p), "3,5,[2,4]");
  EXPECT_EQ(checkpoint::parse_piece("x", "3,5,[2,4]"), p);
  EXPECT_EQ(checkpoint::parse_piece("s", "0,1,[]"), (Piece{"s", 0, 1, {}}));
  for (const char* bad : {"", "3,5", "3,5,2x4", "3,5,[2,4", "-1,5,[2,4]", "3,6,[2,4]", "3,5,[2,]", "3, 5,[2,4]", "a,5,[8]"})
    EXPECT_FALSE(checkpoint::parse_piece("x", bad).has_value()) << bad;
}

}  // namespace
}  // namespace dtrain
