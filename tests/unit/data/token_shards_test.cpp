// llm.c token shards: reading uint16 and uint32 shards as one stream across files, the vocabulary
// rule, and one line naming the file for every malformed shard.
#include "data/token_shards.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "error_of.h"
#include "temp_dir.h"

namespace dtrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::error_of;
using testing::TempDir;

// A shard's bytes as they would be on disk: the 256-int32 header, then `body` raw.
std::vector<uint8_t> shard_bytes(int32_t magic, int32_t version, int32_t count, const std::vector<uint8_t>& body) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::vector<uint8_t> out(1024 + body.size());
  std::memcpy(out.data(), header.data(), 1024);
  if (!body.empty()) std::memcpy(out.data() + 1024, body.data(), body.size());
  return out;
}

std::vector<uint8_t> u16_body(const std::vector<uint16_t>& tokens) {
  std::vector<uint8_t> b(tokens.size() * 2);
  std::memcpy(b.data(), tokens.data(), b.size());
  return b;
}

void put(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<int32_t> all_tokens(const TokenStream& s) {
  std::vector<int32_t> out(static_cast<size_t>(s.size()));
  s.copy(0, out);
  return out;
}

// The error opening `path` alone gives, checked to be one line of kind kData naming the file.
std::string open_error(const std::string& path, int64_t vocab = 0) {
  auto [msg, kind] = error_of([&] { TokenStream::open({path}, vocab); });
  EXPECT_EQ(kind, ErrorKind::kData) << msg;
  EXPECT_THAT(msg, HasSubstr(path + ": "));
  EXPECT_THAT(msg, Not(HasSubstr("\n")));
  return msg;
}

TEST(TokenShards, VocabularyRule) {
  EXPECT_EQ(shard_vocabulary(-1, 0), 256);
  EXPECT_EQ(shard_vocabulary(255, 0), 256);
  EXPECT_EQ(shard_vocabulary(256, 0), 50257);
  EXPECT_EQ(shard_vocabulary(50256, 0), 50257);
  EXPECT_EQ(shard_vocabulary(50257, 0), 50258);
  EXPECT_EQ(shard_vocabulary(128255, 0), 128256);
  EXPECT_EQ(shard_vocabulary(10, 1000), 1000);  // given wins
}

TEST(TokenShards, RoundTripsUint16AndUint32AcrossFiles) {
  TempDir dir;
  const std::vector<uint32_t> a = {1, 2, 65535, 4}, b = {}, c = {70000, 6, 7};
  write_token_shard(dir.file("a.bin"), a);
  write_token_shard(dir.file("b.bin"), b);
  write_token_shard(dir.file("c.bin"), c, /*wide=*/true);
  const TokenStream s = TokenStream::open({dir.file("a.bin"), dir.file("b.bin"), dir.file("c.bin")});
  EXPECT_EQ(s.size(), 7);
  EXPECT_EQ(s.largest_token(), 70000);
  EXPECT_THAT(all_tokens(s), ElementsAre(1, 2, 65535, 4, 70000, 6, 7));
  std::vector<int32_t> across(3);
  s.copy(3, across);  // the end of a.bin, the empty b.bin, the start of c.bin
  EXPECT_THAT(across, ElementsAre(4, 70000, 6));
  std::vector<int32_t> none;
  s.copy(7, none);
  std::vector<int32_t> past(2);
  EXPECT_THROW(s.copy(6, past), Error);
}

TEST(TokenShards, WritesLlmcHeaderAndLittleEndianTokens) {
  TempDir dir;
  const std::vector<uint8_t> text = {'h', 'i', 0xff};
  write_token_shard(dir.file("x.bin"), std::span<const uint8_t>(text));
  EXPECT_EQ(file_bytes(dir.file("x.bin")), shard_bytes(20240520, 1, 3, {'h', 0, 'i', 0, 0xff, 0}));
  const std::vector<uint32_t> wide = {0x01020304};
  write_token_shard(dir.file("w.bin"), wide, true);
  EXPECT_EQ(file_bytes(dir.file("w.bin")), shard_bytes(20240801, 7, 1, {4, 3, 2, 1}));
  // No temporary left beside them.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 2);
  const std::vector<uint32_t> too_big = {65536};
  EXPECT_THROW(write_token_shard(dir.file("big.bin"), too_big), Error);
}

TEST(TokenShards, ShorterThanTheHeaderNamesTheFile) {
  TempDir dir;
  const std::string path = dir.file("short_train.bin");
  put(path, std::vector<uint8_t>(1000, 0));
  EXPECT_THAT(open_error(path), HasSubstr("1000 bytes, shorter than the 1024-byte header"));
  put(path, {});
  EXPECT_THAT(open_error(path), HasSubstr("0 bytes, shorter than the 1024-byte header"));
}

TEST(TokenShards, WrongMagicNamesTheFile) {
  TempDir dir;
  const std::string path = dir.file("x_train.bin");
  put(path, shard_bytes(12345, 1, 0, {}));
  EXPECT_THAT(open_error(path), HasSubstr("not an llm.c token shard (magic 12345, expected 20240520 or 20240801)"));
}

TEST(TokenShards, WrongVersionForTheMagicNamesTheFile) {
  TempDir dir;
  const std::string u16 = dir.file("u16.bin"), u32 = dir.file("u32.bin");
  put(u16, shard_bytes(20240520, 7, 0, {}));  // uint32's version with uint16's magic
  EXPECT_THAT(open_error(u16), HasSubstr("version 7 for magic 20240520 (an llm.c shard of uint16 tokens has version 1)"));
  put(u32, shard_bytes(20240801, 1, 0, {}));
  EXPECT_THAT(open_error(u32), HasSubstr("version 1 for magic 20240801 (an llm.c shard of uint32 tokens has version 7)"));
}

TEST(TokenShards, NegativeCountNamesTheFile) {
  TempDir dir;
  const std::string path = dir.file("neg.bin");
  put(path, shard_bytes(20240520, 1, -3, {}));
  EXPECT_THAT(open_error(path), HasSubstr("the header's token count is negative (-3)"));
}

TEST(TokenShards, SizeThatDisagreesWithTheCountNamesTheFile) {
  TempDir dir;
  const std::string cut = dir.file("cut.bin"), longer = dir.file("long.bin"), wide = dir.file("wide.bin");
  put(cut, shard_bytes(20240520, 1, 4, u16_body({1, 2, 3})));
  EXPECT_THAT(open_error(cut), HasSubstr("the header says 4 tokens (8 bytes), the file holds 6 bytes after its header"));
  put(longer, shard_bytes(20240520, 1, 2, u16_body({1, 2, 3})));
  EXPECT_THAT(open_error(longer), HasSubstr("the header says 2 tokens (4 bytes), the file holds 6 bytes"));
  put(wide, shard_bytes(20240801, 7, 2, u16_body({1, 2})));  // uint16 tokens under the uint32 magic
  EXPECT_THAT(open_error(wide), HasSubstr("the header says 2 tokens (8 bytes), the file holds 4 bytes"));
}

TEST(TokenShards, TokenNotBelowTheVocabularyNamesFileAndPosition) {
  TempDir dir;
  const std::string path = dir.file("v.bin");
  write_token_shard(path, std::vector<uint32_t>{1, 2, 300, 7, 400});
  EXPECT_THAT(open_error(path, 256), HasSubstr("token 2 (id 300) is not below the vocabulary size 256"));
  EXPECT_NO_THROW(TokenStream::open({path}, 401));
  EXPECT_EQ(TokenStream::open({path}).largest_token(), 400);
  const std::string huge = dir.file("huge.bin");
  write_token_shard(huge, std::vector<uint32_t>{5, 0x80000000u}, true);
  EXPECT_THAT(open_error(huge), HasSubstr("token 1 (id 2147483648) does not fit the int32 token ids"));
}

TEST(TokenShards, UnreadableOrNotAFileNamesIt) {
  TempDir dir;
  const std::string missing = dir.file("missing.bin");
  EXPECT_THAT(open_error(missing), HasSubstr("cannot open: No such file or directory"));
  const std::string folder = dir.file("folder_train.bin");
  std::filesystem::create_directories(folder);
  EXPECT_THAT(open_error(folder), HasSubstr("not a regular file"));
  const std::string fifo = dir.file("fifo.bin");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_THAT(open_error(fifo), HasSubstr("not a regular file"));  // not waited on
}

TEST(TokenShards, FindsSplitsInNameOrderLikeGlob) {
  TempDir dir;
  for (const char* name : {"b_train_2.bin", "a_train_1.bin", ".hidden_train.bin", "x_train.bin.tmp123", "val.bin",
                           "train.txt", "fineweb_train_000001.bin"})
    put(dir.file(name), {});
  EXPECT_THAT(shard_files(dir.path().string(), "train"),
              ElementsAre(dir.file("a_train_1.bin"), dir.file("b_train_2.bin"), dir.file("fineweb_train_000001.bin")));
  EXPECT_THAT(shard_files(dir.path().string(), "val"), ElementsAre(dir.file("val.bin")));
}

TEST(TokenShards, OpensBothSplitsAndTakesTheVocabularyFromBoth) {
  TempDir dir;
  std::vector<uint32_t> train(33), val(17);
  std::iota(train.begin(), train.end(), 0u);
  std::iota(val.begin(), val.end(), 240u);  // up to 256: past byte level
  write_token_shard(dir.file("d_train_000001.bin"), std::span(train).subspan(20));
  write_token_shard(dir.file("d_train_000000.bin"), std::span(train).first(20));
  write_token_shard(dir.file("d_val_000000.bin"), val);
  const TokenShards s = open_token_shards(dir.path().string(), 0, 16);
  EXPECT_EQ(s.train.size(), 33);
  EXPECT_EQ(s.val.size(), 17);
  EXPECT_EQ(s.vocab, 50257);
  std::vector<int32_t> t(33);
  s.train.copy(0, t);
  EXPECT_EQ(t, std::vector<int32_t>(train.begin(), train.end()));  // name order, not creation order
  EXPECT_EQ(open_token_shards(dir.path().string(), 300, 16).vocab, 300);
  const auto [msg, kind] = error_of([&] { open_token_shards(dir.path().string(), 256, 16); });
  EXPECT_THAT(msg, HasSubstr(dir.file("d_val_000000.bin") + ": token 16 (id 256) is not below the vocabulary size 256"));
}

TEST(TokenShards, MissingSplitNamesTheDirectory) {
  TempDir dir;
  const std::string d = dir.path().string();
  auto [none, kind] = error_of([&] { open_token_shards(d, 0, 4); });
  EXPECT_EQ(kind, ErrorKind::kData);
  EXPECT_EQ(none, d + ": no training shards (*train*.bin)");
  write_token_shard(dir.file("train.bin"), std::vector<uint32_t>(10, 1));
  EXPECT_EQ(error_of([&] { open_token_shards(d, 0, 4); }).first, d + ": no validation shards (*val*.bin)");
  EXPECT_EQ(error_of([&] { open_token_shards(dir.file("absent"), 0, 4); }).first,
            dir.file("absent") + ": data directory not found");
}

// A shard in both splits would be validated on after being trained on: refused, naming it.
TEST(TokenShards, AShardNamedForBothSplitsNamesTheFile) {
  TempDir dir;
  const std::string d = dir.path().string();
  write_token_shard(dir.file("a_train.bin"), std::vector<uint32_t>(20, 1));
  write_token_shard(dir.file("a_val.bin"), std::vector<uint32_t>(20, 1));
  write_token_shard(dir.file("medieval_train_000.bin"), std::vector<uint32_t>(20, 1));
  auto [msg, kind] = error_of([&] { open_token_shards(d, 0, 8); });
  EXPECT_EQ(kind, ErrorKind::kData);
  EXPECT_EQ(msg, dir.file("medieval_train_000.bin") +
                     ": the name matches both *train*.bin and *val*.bin: rename it to hold one");
}

TEST(TokenShards, SplitShorterThanOneSequenceNamesItsFiles) {
  TempDir dir;
  const std::string d = dir.path().string();
  write_token_shard(dir.file("a_train.bin"), std::vector<uint32_t>(6, 1));
  write_token_shard(dir.file("b_train.bin"), std::vector<uint32_t>(2, 1));
  write_token_shard(dir.file("val.bin"), std::vector<uint32_t>(8, 1));
  EXPECT_NO_THROW(open_token_shards(d, 0, 7));  // 8 tokens: one sequence of 7 and its next token
  auto [msg, kind] = error_of([&] { open_token_shards(d, 0, 8); });
  EXPECT_EQ(kind, ErrorKind::kData);
  EXPECT_EQ(msg, dir.file("a_train.bin") + " ... " + dir.file("b_train.bin") +
                     " (2 files): 8 tokens, fewer than one batch of 8 tokens (batch size x context) and its next token (9)");
  write_token_shard(dir.file("b_train.bin"), std::vector<uint32_t>(20, 1));
  EXPECT_EQ(error_of([&] { open_token_shards(d, 0, 8); }).first,
            dir.file("val.bin") + ": 8 tokens, fewer than one batch of 8 tokens (batch size x context) and its next token (9)");
}

TEST(TokenShards, TheStreamReadsTheMappedFileNotACopy) {
  TempDir dir;
  const std::string path = dir.file("m.bin");
  write_token_shard(path, std::vector<uint32_t>{1, 2, 3});
  const TokenStream s = TokenStream::open({path});
  // Rewrite a token in place: a mapping shares the page cache and sees it, a copy would not.
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(1024 + 2);
    const uint16_t nine = 9;
    f.write(reinterpret_cast<const char*>(&nine), 2);
  }
  EXPECT_THAT(all_tokens(s), ElementsAre(1, 9, 3));
}

}  // namespace
}  // namespace dtrain
