// The pure half of `dtrain bench allreduce`: sizes, exact inputs, statistics, the check and
// the fastest-path summary.
#include "app/bench_report.h"

#include <gtest/gtest.h>

namespace dtrain {
namespace {

TEST(BenchReport, SizesDoubleFromMinToMax) {
  const std::vector<int64_t> sizes = bench_sizes(8, int64_t{256} << 20);
  ASSERT_EQ(sizes.size(), 26u);  // 2^3 .. 2^28
  EXPECT_EQ(sizes.front(), 8);
  EXPECT_EQ(sizes.back(), int64_t{256} << 20);
  EXPECT_EQ(bench_sizes(8, 15), std::vector<int64_t>{8});
}

TEST(BenchReport, BusBandwidthIsNcclTestsFactor) {
  EXPECT_DOUBLE_EQ(bus_bandwidth(10.0, 2), 10.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth(10.0, 4), 15.0);
  EXPECT_DOUBLE_EQ(median_of({5, 1, 3}), 3);
  EXPECT_DOUBLE_EQ(median_of({4, 1, 3, 2}), 2.5);
}

TEST(BenchReport, ExpectedSumsAreExactInBf16) {
  for (int ranks : {2, 4, 64})
    for (int64_t i = 0; i < 50; ++i) {
      const float sum = bench_expected_sum(ranks, i);
      const auto bytes = encode_values(DType::kBF16, 1, [&](int64_t) { return sum; });
      EXPECT_EQ(decode_value(bytes.data(), DType::kBF16, 0), sum) << ranks << " ranks, element " << i;
    }
}

TEST(BenchReport, CheckCountsEveryWrongElement) {
  auto expected = encode_values(DType::kF32, 1000, [](int64_t i) { return bench_expected_sum(4, i); });
  auto got = expected;
  int64_t first = -1;
  EXPECT_EQ(count_wrong(got.data(), expected.data(), 1000, DType::kF32, &first), 0);
  got[4 * 700 + 3] ^= 1;
  got[4 * 10] ^= 1;  // the lowest mantissa bit: still wrong
  EXPECT_EQ(count_wrong(got.data(), expected.data(), 1000, DType::kF32, &first), 2);
  EXPECT_EQ(first, 10);
}

TEST(BenchReport, FastestPathsAreRangesOfSizes) {
  std::vector<BenchRow> rows;
  for (int64_t b : {8, 16, 32, 64}) {
    rows.push_back({"flat", DType::kF32, b, b / 4, b < 32 ? 1.0 : 3.0});
    rows.push_back({"hierarchical", DType::kF32, b, b / 4, 2.0});
  }
  const std::vector<std::string> lines = fastest_paths(rows);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "float32: flat 8 B - 16 B; hierarchical 32 B - 64 B");
}

}  // namespace
}  // namespace dtrain
