// LmBatches (app/lm_batches.h) on CPU, in the language-model loop's order (stage_train(g), then
// prefetch_train(g + N) before the step): each staged training slot holds that slot's tokens as
// inputs [B, T] and targets [B*T] shifted by one, also when the prefetched g is not the one asked
// for next and when a validation slot is staged in between (what the loop does at --eval-every).
// The CUDA stager behind prefetch_train is covered by tests/gpu/batch_stager_test.cpp.
#include "app/lm_batches.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>

namespace dtrain {
namespace {

namespace fs = std::filesystem;

// An llm.c shard (header of 256 int32: magic 20240520, version 1, count; uint16 tokens) of `n`
// tokens, token p = (p * 7 + first) mod 256.
void write_shard(const fs::path& path, int64_t n, int first) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<int32_t>(n);
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) tokens[static_cast<size_t>(p)] = static_cast<uint16_t>((p * 7 + first) % 256);
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size() * 4));
  f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
}

int32_t token(int64_t p, int first) { return static_cast<int32_t>((p * 7 + first) % 256); }

// Slot s of B*T tokens: inputs tokens [s*B*T, +B*T), targets the same shifted by one.
void expect_slot(const LmBatches& b, int64_t slot, int64_t bt, int first, const char* what) {
  ASSERT_EQ(b.inputs().numel(), bt);
  ASSERT_EQ(b.targets().numel(), bt);
  for (int64_t i = 0; i < bt; ++i) {
    ASSERT_EQ(b.inputs().data_as<int32_t>()[i], token(slot * bt + i, first)) << what << " slot " << slot << " i " << i;
    ASSERT_EQ(b.targets().data_as<int32_t>()[i], token(slot * bt + i + 1, first)) << what << " slot " << slot;
  }
}

TEST(LmBatches, StagedSlotsHoldTheirTokensInTheLoopsPrefetchOrder) {
  const fs::path dir = fs::temp_directory_path() / ("dtrain_lm_batches." + std::to_string(getpid()));
  fs::create_directories(dir);
  const int64_t B = 2, T = 4, bt = B * T, world = 2;
  write_shard(dir / "t_train_000000.bin", 20 * bt + 1, 0);  // 20 slots
  write_shard(dir / "t_val_000000.bin", 3 * bt + 1, 100);   // 3 slots
  TrainConfig c;
  c.data.dir = dir.string();
  c.data.shuffle = false;  // slot g is g
  c.batch_size = B;
  c.lm.emplace();
  c.lm->context = T;
  c.lm->vocab = 256;
  {
    LmBatches b(c, Device::cpu());
    ASSERT_EQ(b.val_slots(), 3);
    for (int64_t g = 1; g < 9; g += world) {  // rank 1 of 2
      b.stage_train(g);
      b.prefetch_train(g + world);
      expect_slot(b, g, bt, 0, "train");
      if (g == 5) {  // an evaluation between two steps
        b.stage_val(2);
        expect_slot(b, 2, bt, 100, "val");
      }
    }
    b.stage_train(12);  // not the prefetched 9: its own slot
    expect_slot(b, 12, bt, 0, "train after another prefetch");
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dtrain
