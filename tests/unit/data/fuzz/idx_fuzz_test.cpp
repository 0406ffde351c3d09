// IDX fuzz: seeded mutants of a small, valid pair of splits (raw and gzip; header bytes flipped,
// truncation, huge or zero dimensions, wrong type codes and ranks, trailing garbage, corrupt
// gzip streams and trailers), each loaded in-process the way the trainer loads its data
// (load_mnist_splits: read, then the dataset checks). Every mutant must end in a one-line
// dtrain::Error naming a file of the data set, or in a valid data set; never a crash, a hang, an
// exception of another type, or an allocation out of proportion to a file of a few hundred bytes.
// Its own binary: it replaces operator new to see the largest single allocation.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "data/idx_reader.h"
#include "data/mnist.h"
#include "temp_dir.h"

namespace {
std::atomic<size_t> g_largest_allocation{0};

void* counted_alloc(size_t n) {
  size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
  while (n > seen && !g_largest_allocation.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(size_t n) { return counted_alloc(n); }
void* operator new[](size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace dtrain {
namespace {

using testing::TempDir;

// Far above what a data set of a few hundred bytes needs, far below a corrupt header's claims.
constexpr size_t kMaxAllocation = size_t{8} << 20;

enum class Mutation {
  kFlipHeaderByte, kTruncate, kHugeDimension, kZeroDimension, kTypeCode, kRank, kTrailingGarbage, kFlipPayloadByte,
  kReshape, kFlipGzipByte, kTruncateGzip, kGarbageAfterGzip, kGzipTrailer, kCount
};

const char* mutation_name(Mutation m) {
  static const char* names[] = {"flip header byte", "truncate", "huge dimension", "zero dimension", "type code",
                                "rank", "trailing garbage", "flip payload byte", "reshape", "flip gzip byte", "truncate gzip",
                                "garbage after gzip", "gzip trailer"};
  return names[static_cast<int>(m)];
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// An unsigned-byte IDX file of `dims` with a deterministic payload (labels below 10).
std::vector<uint8_t> idx_file(const std::vector<int64_t>& dims, bool labels) {
  std::vector<uint8_t> b = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  int64_t n = 1;
  for (int64_t d : dims) {
    n *= d;
    for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<uint8_t>(d >> shift));
  }
  for (int64_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(labels ? (i * 7) % 10 : (i * 37 + 11) % 256));
  return b;
}

// The IDX bytes `m` makes of `idx` (header-level mutations), before any gzip.
void mutate_idx(std::vector<uint8_t>& idx, Mutation m, std::mt19937& rng) {
  const size_t ndim = idx[3], header = 4 + 4 * ndim;
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto set_dim = [&](size_t i, uint32_t v) {
    for (int k = 0; k < 4; ++k) idx[4 + 4 * i + k] = static_cast<uint8_t>(v >> (24 - 8 * k));
  };
  switch (m) {
    case Mutation::kFlipHeaderByte: idx[pick(header)] ^= static_cast<uint8_t>(1 + pick(255)); break;
    case Mutation::kTruncate: idx.resize(pick(idx.size())); break;
    case Mutation::kHugeDimension: {
      static const uint32_t huge[] = {0xffffffffu, 0x7fffffffu, 0x01000000u, 60000u, 65536u, 0x80000000u};
      set_dim(pick(ndim), huge[pick(std::size(huge))]);
      break;
    }
    case Mutation::kZeroDimension: set_dim(pick(ndim), 0); break;
    case Mutation::kTypeCode: {
      static const uint8_t codes[] = {0x09, 0x0B, 0x0C, 0x0D, 0x0E, 0x00, 0xff};
      idx[2] = codes[pick(std::size(codes))];
      break;
    }
    case Mutation::kRank: idx[3] = static_cast<uint8_t>(pick(256)); break;
    case Mutation::kTrailingGarbage:
      for (size_t n = 1 + pick(64); n > 0; --n) idx.push_back(static_cast<uint8_t>(rng()));
      break;
    case Mutation::kFlipPayloadByte:
      if (idx.size() > header) idx[header + pick(idx.size() - header)] ^= static_cast<uint8_t>(1 + pick(255));
      break;
    case Mutation::kReshape: {  // the same bytes under another shape (the 14x56, 1x784, 784x1)
      if (ndim < 2) break;
      static const std::vector<std::vector<uint32_t>> shapes = {{2, 6}, {6, 2}, {1, 12}, {12, 1}, {3, 4}, {4, 3},
                                                                {1, 4, 3}, {3, 2, 2}, {2, 2, 3}, {12, 1, 1}};
      const std::vector<uint32_t>& shape = shapes[pick(shapes.size())];
      std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(shape.size() + 1)};
      out.insert(out.end(), idx.begin() + 4, idx.begin() + 8);  // the sample count stays
      for (uint32_t d : shape)
        for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
      out.insert(out.end(), idx.begin() + static_cast<std::ptrdiff_t>(header), idx.end());
      idx = std::move(out);
      break;
    }
    default: break;
  }
}

// Gzip-level mutations of a compressed file.
void mutate_gzip(std::vector<uint8_t>& gz, Mutation m, std::mt19937& rng) {
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  switch (m) {
    case Mutation::kFlipGzipByte:
      for (size_t n = 1 + pick(3); n > 0; --n) gz[pick(gz.size())] ^= static_cast<uint8_t>(1 + pick(255));
      break;
    case Mutation::kTruncateGzip: gz.resize(pick(gz.size())); break;
    case Mutation::kGarbageAfterGzip:
      for (size_t n = 1 + pick(64); n > 0; --n) gz.push_back(static_cast<uint8_t>(rng()));
      break;
    case Mutation::kGzipTrailer: gz[gz.size() - 1 - pick(8)] ^= static_cast<uint8_t>(1 + pick(255)); break;
    default: break;
  }
}

struct FuzzCounts {
  int mutants = 0, rejected = 0, accepted = 0;
};

// A valid data set must hold together: every sample readable, labels within its classes,
// both splits of one shape.
void check_valid(const MnistSplits& s, const std::string& what) {
  ASSERT_EQ(s.train->sample_shape(), s.test->sample_shape()) << what;
  ASSERT_EQ(s.train->num_classes(), s.test->num_classes()) << what;
  for (const MnistDataset* ds : {s.train.get(), s.test.get()}) {
    std::vector<float> out(static_cast<size_t>(shape_numel(ds->sample_shape())));
    for (int64_t i = 0; i < ds->size(); ++i) {
      const int32_t label = ds->get(i, out.data());
      ASSERT_TRUE(label >= 0 && label < ds->num_classes()) << what;
      for (float v : out) ASSERT_TRUE(v >= 0.f && v <= 1.f) << what;
    }
  }
}

TEST(IdxFuzz, EveryMutantIsAOneLineErrorOrAValidDataSet) {
  const std::vector<std::string> stems = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
  const std::vector<std::vector<int64_t>> dims = {{6, 4, 3}, {6}, {3, 4, 3}, {3}};
  constexpr int kMutants = 520;
  std::mt19937 rng(20240613);
  FuzzCounts counts;
  std::vector<FuzzCounts> by_kind(static_cast<size_t>(Mutation::kCount));
  for (int m = 0; m < kMutants; ++m) {
    TempDir dir;
    const bool gzip = m % 2 == 1;
    const int kinds = gzip ? static_cast<int>(Mutation::kCount) : static_cast<int>(Mutation::kFlipGzipByte);
    const auto kind = static_cast<Mutation>(rng() % static_cast<unsigned>(kinds));
    const size_t target = rng() % stems.size();
    std::string target_path;
    for (size_t f = 0; f < stems.size(); ++f) {
      std::vector<uint8_t> idx = idx_file(dims[f], f % 2 == 1);
      if (f == target) mutate_idx(idx, kind, rng);
      const std::string path = dir.file(stems[f] + (gzip ? ".gz" : ""));
      write_bytes(path, idx, gzip);
      if (gzip && f == target) {
        std::vector<uint8_t> gz = file_bytes(path);
        mutate_gzip(gz, kind, rng);
        write_bytes(path, gz, false);
      }
      if (f == target) target_path = path;
    }
    const std::string what = fmt::format("mutant {} ({}, {}, {})", m, mutation_name(kind), gzip ? "gzip" : "raw",
                                         stems[target]);
    FuzzCounts& k = by_kind[static_cast<size_t>(kind)];
    ++counts.mutants;
    ++k.mutants;
    g_largest_allocation = 0;
    try {
      MnistSplits splits = load_mnist_splits(dir.path().string());
      check_valid(splits, what);
      ++counts.accepted;
      ++k.accepted;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << what << ": " << msg;
      EXPECT_NE(msg.find(target_path), std::string::npos) << what << ": the message does not name the file: " << msg;
      ++counts.rejected;
      ++k.rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": not a dtrain::Error: " << e.what();
    }
    EXPECT_LE(g_largest_allocation.load(), kMaxAllocation) << what << ": allocated " << g_largest_allocation.load();
    if (::testing::Test::HasFailure()) break;  // one mutant's story is enough
  }
  std::printf("IDX fuzz: %d mutants, %d rejected with a one-line error, %d accepted as valid, 0 crashes\n",
              counts.mutants, counts.rejected, counts.accepted);
  for (size_t i = 0; i < by_kind.size(); ++i)
    std::printf("  %-20s %3d mutants: %3d rejected, %3d valid\n", mutation_name(static_cast<Mutation>(i)),
                by_kind[i].mutants, by_kind[i].rejected, by_kind[i].accepted);
  EXPECT_EQ(counts.mutants, kMutants);
  EXPECT_EQ(counts.rejected + counts.accepted, counts.mutants);
  EXPECT_GT(counts.rejected, kMutants / 2);  // the mutations do break things
  EXPECT_GT(counts.accepted, 0);             // and some leave a valid data set
}

}  // namespace
}  // namespace dtrain
