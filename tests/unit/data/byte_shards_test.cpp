// Byte-level shards: llmc_shards.py's walk order and split, the files written, stale shards of a
// larger earlier run removed, and one line for input that cannot be used (a split under 2 tokens too).
#include "data/byte_shards.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/token_shards.h"
#include "error_of.h"
#include "temp_dir.h"

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::error_of;
using testing::TempDir;
namespace fs = std::filesystem;

void put(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

TEST(ByteShards, WalksFoldersAsOsWalkWithSortedNames) {
  TempDir d;
  const std::string root = d.file("src");
  for (const char* f : {"src/b.py", "src/a.txt", "src/skip.pyc", "src/z/c.md", "src/a/d.rst", "src/a/e.h",
                        "src/a/sub/f.c", "src/noext", "other.bin"})
    put(d.file(f), f);
  fs::create_directory_symlink(d.file("src/a"), d.file("src/link_to_a"));  // listed, not walked
  EXPECT_THAT(text_files({root, d.file("other.bin")}),
              ElementsAre(root + "/a.txt", root + "/b.py", root + "/a/d.rst", root + "/a/e.h", root + "/a/sub/f.c",
                          root + "/z/c.md", d.file("other.bin")));  // a file given is taken whatever its name
}

TEST(ByteShards, ValidationIsOneTwentiethCappedAtOneMiB) {
  for (int64_t n : {0, 1, 19, 20, 21, 39, 40, 1000, 12345, 20971520, 20971540, 123456789})
    EXPECT_EQ(validation_bytes(n, std::nullopt), std::min<int64_t>(n / 20, 1 << 20)) << n;
  for (int64_t n = 0; n < 5000; ++n) EXPECT_EQ(validation_bytes(n, 0.05), n / 20) << n;  // no rounding below
  EXPECT_EQ(validation_bytes(1000, 0.1), 100);
  EXPECT_EQ(validation_bytes(100'000'000, 0.1), 10'000'000);  // a given fraction is not capped
}

TEST(ByteShards, WritesValThenTrainShards) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 100; ++i) text += static_cast<char>('a' + i % 26);
  put(d.file("in/x.txt"), text.substr(0, 60));
  put(d.file("in/y.txt"), text.substr(60));
  const ByteShardSummary s = write_byte_shards({d.file("in")}, d.file("out"));
  EXPECT_EQ(s.val_tokens, 5);
  EXPECT_EQ(s.train_tokens, 95);
  EXPECT_THAT(s.files, ElementsAre(d.file("out/bytes_val_000000.bin"), d.file("out/bytes_train_000000.bin")));
  const TokenShards shards = open_token_shards(d.file("out"), 0, 4);
  EXPECT_EQ(shards.vocab, 256);
  std::vector<int32_t> val(5), train(95);
  shards.val.copy(0, val);
  shards.train.copy(0, train);
  EXPECT_EQ(std::string(val.begin(), val.end()), text.substr(0, 5));
  EXPECT_EQ(std::string(train.begin(), train.end()), text.substr(5));
}

TEST(ByteShards, RemovesTrainShardsOfALargerEarlierRun) {
  TempDir d;
  put(d.file("in.txt"), std::string(400, 'q'));
  put(d.file("out/bytes_train_000001.bin"), "old");
  put(d.file("out/bytes_train_000007.bin"), "old");
  put(d.file("out/notes_train.txt"), "mine");
  const ByteShardSummary s = write_byte_shards({d.file("in.txt")}, d.file("out"));
  EXPECT_THAT(s.removed, ElementsAre(d.file("out/bytes_train_000001.bin"), d.file("out/bytes_train_000007.bin")));
  EXPECT_FALSE(fs::exists(d.file("out/bytes_train_000001.bin")));
  EXPECT_TRUE(fs::exists(d.file("out/notes_train.txt")));
  EXPECT_EQ(open_token_shards(d.file("out"), 0, 4).train.size(), 380);
}

TEST(ByteShards, UnusableInputIsOneLine) {
  TempDir d;
  auto [missing, kind] = error_of([&] { write_byte_shards({d.file("nope")}, d.file("out")); });
  EXPECT_EQ(missing, d.file("nope") + ": no such file or folder");
  EXPECT_EQ(kind, ErrorKind::kData);
  put(d.file("empty/a.pyc"), "binary");
  EXPECT_THAT(error_of([&] { write_byte_shards({d.file("empty")}, d.file("out")); }).first,
              HasSubstr("no text found in " + d.file("empty")));
  put(d.file("in.txt"), std::string(40, 't'));  // 2 validation bytes: the smallest usable split
  put(d.file("file"), "x");
  const auto [out, out_kind] = error_of([&] { write_byte_shards({d.file("in.txt")}, d.file("file/sub")); });
  EXPECT_THAT(out, HasSubstr(d.file("file/sub") + ": cannot create the output folder"));
  EXPECT_EQ(out_kind, ErrorKind::kOutput);
}

TEST(ByteShards, ASplitUnderTwoTokensIsRefusedNamingTheOutputFolder) {
  TempDir d;
  put(d.file("small.txt"), std::string(39, 's'));  // 39 / 20 = 1 validation byte
  const auto [small, kind] = error_of([&] { write_byte_shards({d.file("small.txt")}, d.file("o1")); });
  EXPECT_EQ(small, d.file("o1") + ": 39 bytes of text split into 1 validation and 38 training tokens; each split "
                                   "needs at least 2 (more text, or another --val-fraction)");
  EXPECT_EQ(kind, ErrorKind::kData);
  put(d.file("big.txt"), std::string(1000, 'b'));
  EXPECT_THAT(error_of([&] { write_byte_shards({d.file("big.txt")}, d.file("o2"), 0.001); }).first,
              HasSubstr("split into 1 validation and 999 training tokens"));
  EXPECT_THAT(error_of([&] { write_byte_shards({d.file("big.txt")}, d.file("o3"), 0.9995); }).first,
              HasSubstr("split into 999 validation and 1 training tokens"));
  for (const char* o : {"o1", "o2", "o3"}) EXPECT_FALSE(fs::exists(d.file(o))) << o;  // nothing written
  EXPECT_EQ(write_byte_shards({d.file("big.txt")}, d.file("o4"), 0.002).val_tokens, 2);  // the limit itself is fine
}

}  // namespace
}  // namespace dtrain
