// Finiteness of checkpoint tensors (checkpoint/finite.h): what counts, how it is said, and the
// writer refusing a snapshot with a NaN or an infinity without touching the directory.
#include "checkpoint/finite.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>

#include <gtest/gtest.h>

#include "../data/temp_dir.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "core/error.h"
#include "synthetic.h"

namespace dtrain::checkpoint {
namespace {

namespace fs = std::filesystem;
using dtrain::testing::synthetic_snapshot;
using dtrain::testing::TempDir;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

template <class T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span(v));
}

TEST(Finite, CountsNanAndBothInfinitiesAndNamesTheFirst) {
  const std::vector<float> v = {1.f, -0.f, kInf, 3e38f, kNan, -kInf, std::numeric_limits<float>::denorm_min()};
  const NonfiniteValues found = find_nonfinite(safetensors::Dtype::kF32, bytes_of(v));
  EXPECT_EQ(found.count, 3);
  EXPECT_EQ(found.first_index, 2);
  EXPECT_EQ(describe(found), "3 non-finite value(s) (first: inf at index 2)");
  const std::vector<double> d = {0.0, -std::numeric_limits<double>::infinity()};
  EXPECT_EQ(describe(find_nonfinite(safetensors::Dtype::kF64, bytes_of(d))), "1 non-finite value(s) (first: -inf at index 1)");
  const std::vector<float> nan = {-kNan};  // a NaN is "nan" whatever its sign bit
  EXPECT_EQ(describe(find_nonfinite(safetensors::Dtype::kF32, bytes_of(nan))), "1 non-finite value(s) (first: nan at index 0)");
}

TEST(Finite, FiniteTensorsAndIntegerDtypesHaveNone) {
  const std::vector<float> v = {0.f, std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest()};
  EXPECT_EQ(find_nonfinite(safetensors::Dtype::kF32, bytes_of(v)).count, 0);
  const std::vector<int32_t> i = {0x7fc00000};  // NaN's bits, as an integer: not a float
  EXPECT_EQ(find_nonfinite(safetensors::Dtype::kI32, bytes_of(i)).count, 0);
  EXPECT_EQ(find_nonfinite(safetensors::Dtype::kF32, {}).count, 0);
}

TEST(Finite, NamesTheFirstTensorWithANonFiniteValue) {
  CheckpointSnapshot s = synthetic_snapshot(4, 16);
  EXPECT_EQ(first_nonfinite_tensor(s.model), "");
  Tensor bias = dtrain::testing::synthetic_tensor(4, 1, {10});
  bias.data()[7] = kNan;
  s.model[1] = safetensors::host_copy("0.bias", bias);
  EXPECT_EQ(first_nonfinite_tensor(s.model), "0.bias: 1 non-finite value(s) (first: nan at index 7)");
}

std::map<std::string, std::string> listing(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    out[fs::relative(e.path(), dir).string()] =
        e.is_directory() ? "<dir>" : std::string(std::istreambuf_iterator<char>(in), {});
  }
  return out;
}

// The writer's own guarantee: whatever the caller checked, a NaN never replaces a checkpoint.
TEST(Finite, TheWriterRefusesANonFiniteSnapshotAndTouchesNothing) {
  TempDir tmp;
  const CheckpointWriterOptions options{.dir = tmp.path(), .keep = 1, .fault_after_bytes = std::nullopt};
  CheckpointSnapshot good = synthetic_snapshot(4);
  write_checkpoint(options, good);
  const auto before = listing(tmp.path());
  for (bool in_optimizer : {false, true}) {
    CheckpointSnapshot bad = synthetic_snapshot(8);
    Tensor t = dtrain::testing::synthetic_tensor(8, 3, {10});
    t.data()[0] = -kInf;
    (in_optimizer ? bad.optimizer[1] : bad.model[1]) = safetensors::host_copy(in_optimizer ? "0.bias.momentum_buffer" : "0.bias", t);
    try {
      write_checkpoint(options, bad);
      FAIL() << "written";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                fmt::format("checkpoint {}/step-8 not saved: {}: {}: 1 non-finite value(s) (first: -inf at index 0)",
                            tmp.path().string(), in_optimizer ? "optimizer.safetensors" : "model.safetensors",
                            in_optimizer ? "0.bias.momentum_buffer" : "0.bias"));
    }
    EXPECT_EQ(listing(tmp.path()), before);  // step-4 kept, `latest` unchanged, nothing left behind
  }
}

TEST(Finite, AFileIsCheckedTensorByTensor) {
  TempDir tmp;
  std::vector<float> w(6, 0.5f);
  w[4] = kNan;
  const std::vector<float> b(2, 1.f);
  const fs::path path = tmp.path() / "w.safetensors";
  safetensors::write_file(path.string(), std::vector<safetensors::TensorRef>{{"a", safetensors::Dtype::kF32, {2}, bytes_of(b)},
                                                                      {"b", safetensors::Dtype::kF32, {2, 3}, bytes_of(w)}});
  EXPECT_EQ(first_nonfinite_tensor(safetensors::read_file(path.string())), "b: 1 non-finite value(s) (first: nan at index 4)");
}

}  // namespace
}  // namespace dtrain::checkpoint
