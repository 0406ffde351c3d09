// detect_data_format: llm.c shards, IDX files, and one line saying what a folder lacks.
#include "data/data_format.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/token_shards.h"
#include "temp_dir.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

void put(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string detect_error(const std::string& dir) {
  try {
    detect_data_format(dir);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kData);
    return e.what();
  }
  return "";
}

TEST(DataFormat, NamesParse) {
  EXPECT_EQ(parse_data_format("auto"), DataFormat::kAuto);
  EXPECT_EQ(parse_data_format("idx"), DataFormat::kIdx);
  EXPECT_EQ(parse_data_format("llmc"), DataFormat::kLlmc);
  EXPECT_EQ(parse_data_format("numpy"), std::nullopt);
  EXPECT_STREQ(data_format_name(DataFormat::kLlmc), "llmc");
}

TEST(DataFormat, LlmcShardsOfEitherWidth) {
  TempDir a, b;
  write_token_shard(a.file("tiny_train_000000.bin"), std::vector<uint32_t>{1, 2});
  EXPECT_EQ(detect_data_format(a.path().string()), DataFormat::kLlmc);
  write_token_shard(b.file("edu_fineweb_train_000001.bin"), std::vector<uint32_t>{1, 2}, true);
  EXPECT_EQ(detect_data_format(b.path().string()), DataFormat::kLlmc);
}

TEST(DataFormat, IdxFilesRawOrGzip) {
  TempDir a, b;
  put(a.file("train-images-idx3-ubyte.gz"), "x");
  EXPECT_EQ(detect_data_format(a.path().string()), DataFormat::kIdx);
  put(b.file("train-images-idx3-ubyte"), "x");
  EXPECT_EQ(detect_data_format(b.path().string()), DataFormat::kIdx);
#ifdef DTRAIN_FMNIST_DIR
  if (std::filesystem::exists(DTRAIN_FMNIST_DIR)) {
    EXPECT_EQ(detect_data_format(DTRAIN_FMNIST_DIR), DataFormat::kIdx);
  }
#endif
}

TEST(DataFormat, ShardsWinOverIdxFilesBesideThem) {
  TempDir a;
  put(a.file("train-images-idx3-ubyte"), "x");
  write_token_shard(a.file("train.bin"), std::vector<uint32_t>{1});
  EXPECT_EQ(detect_data_format(a.path().string()), DataFormat::kLlmc);
}

TEST(DataFormat, NumpyArraysOrArchive) {
  TempDir a, b, c;
  put(a.file("train_x.npy"), "x");
  EXPECT_EQ(detect_data_format(a.path().string()), DataFormat::kNpy);
  put(b.file("train.npz"), "x");
  EXPECT_EQ(detect_data_format(b.path().string()), DataFormat::kNpy);
  put(c.file("train.npz"), "x");
  put(c.file("train-images-idx3-ubyte"), "x");  // IDX files beside them win, as before NumPy data existed
  EXPECT_EQ(detect_data_format(c.path().string()), DataFormat::kIdx);
  EXPECT_EQ(parse_data_format("npy"), DataFormat::kNpy);
  EXPECT_STREQ(data_format_name(DataFormat::kNpy), "npy");
}

TEST(DataFormat, SaysWhatTheFolderLacks) {
  TempDir empty, wrong;
  const std::string e = empty.path().string(), w = wrong.path().string();
  EXPECT_EQ(detect_error(e), e + ": no llm.c token shards (*train*.bin), no IDX files (train-images-idx3-ubyte[.gz]) "
                                 "and no NumPy data (train.npz or train_x.npy): not a data directory dtrain reads");
  put(wrong.file("my_train.bin"), std::string(2048, 'a'));
  EXPECT_THAT(detect_error(w), HasSubstr(w + ": no llm.c token shards (my_train.bin does not start with magic "
                                             "20240520 or 20240801), no IDX files"));
  EXPECT_EQ(detect_error(empty.file("nope")), empty.file("nope") + ": data directory not found");
}

}  // namespace
}  // namespace dtrain
