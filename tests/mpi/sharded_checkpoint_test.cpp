// Sharded optimizer checkpoints over MPI at np 2 and 3 (Note [Sharded optimizer state]): each rank
// exports its slice (as a ZeRO optimizer does), the other ranks stream theirs to rank 0 in small
// chunks while the model is written in the background, and the checkpoint loads back at the same
// world size, sliced or whole, to the bit.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/checkpoint_reader.h"
#include "comm/exchange.h"
#include "model/models.h"
#include "tests/mpi/mpi_test_env.h"
#include "tests/unit/train/sharded_state.h"
#include "train/checkpointer.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Sequential> tiny_model() {
  ModelSpec spec;
  spec.hidden = {4};
  spec.memory_budget_bytes = 1 << 30;
  return build_model(spec, {1, 2, 2}, 3, Device::cpu(), 5);
}

TEST(ShardedCheckpointMpi, EachRankSavesItsSliceAndLoadsItBackBitwise) {
  Communicator& comm = testing::test_comm();
  const int n = comm.size(), me = comm.rank();
  std::string dir;
  if (me == 0) dir = (fs::temp_directory_path() / fmt::format("dtrain_sharded_{}", ::getpid())).string();
  dir = broadcast_string(comm, dir);
  const OptimizerState full = testing::full_state(5);
  auto model = tiny_model();
  {
    testing::FixedStateOptimizer mine(testing::slice_of(full, me, n));
    Checkpointer saver(comm, {.dir = dir, .background = true, .transfer_chunk_bytes = 32});
    checkpoint::TrainingState state;
    state.global_step = 4;
    state.world_size = n;
    saver.save(state, *model, mine);
    saver.finish();
  }
  if (me == 0) {
    const checkpoint::LoadedCheckpoint c = checkpoint::read_checkpoint(dir);
    EXPECT_EQ(c.state.optimizer_shards, n);
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(fs::exists(fs::path(dir) / "step-4" / checkpoint::optimizer_shard_name(r, n))) << r;
    EXPECT_FALSE(fs::exists(fs::path(dir) / "step-4" / "optimizer.safetensors"));
  }
  testing::FixedStateOptimizer sliced;
  ASSERT_TRUE(restore_newest(comm, dir, *model, sliced, nullptr, testing::pieces_of(full, me, n)).has_value());
  EXPECT_EQ(testing::state_difference(sliced.state(), testing::slice_of(full, me, n)), "");
  testing::FixedStateOptimizer whole;
  ASSERT_TRUE(restore_newest(comm, dir, *model, whole).has_value());
  EXPECT_EQ(testing::state_difference(whole.state(), full), "");
  comm.barrier();
  if (me == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace dtrain
