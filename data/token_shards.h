// llm.c's token shards (karpathy/llm.c, llmc/dataloader.h): a header of 256 little-endian int32
// ([0] magic, [1] version, [2] token count) then the tokens, uint16 (magic 20240520, version 1) or
// uint32 (magic 20240801, version 7). A split (DIR/*train*.bin or DIR/*val*.bin, name order) is
// opened as one token stream over read-only mappings of its files: every rank of a node reads the
// same page-cache pages, none copies the data. Every shard is checked whole when it is opened.
//
// Little-endian hosts only: the tokens are read in place from the mapping (a static_assert in
// token_shards.cpp stops a big-endian build rather than letting it read swapped ids).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dtrain {

inline constexpr int32_t kShardMagicU16 = 20240520;  // version 1, uint16 tokens (GPT-2's files)
inline constexpr int32_t kShardMagicU32 = 20240801;  // version 7, uint32 tokens (llm.c's LLaMA-3 files)
inline constexpr int64_t kShardHeaderBytes = 256 * 4;

// The vocabulary of a run: `given` when > 0; else 256 when every token is below 256 (byte
// level), else 50257 (GPT-2's BPE) when every token is below it, else the largest + 1.
// `largest_token` -1 means no tokens at all (256). Pure.
int64_t shard_vocabulary(int64_t largest_token, int64_t given);

// One split's shards as one stream of tokens. Movable, not copyable (it owns the mappings).
class TokenStream {
 public:
  // Maps and checks `paths` in the given order. vocab > 0: every token must be below it. Throws
  // dtrain::Error of kind kData, one line naming the file: not a regular file or unreadable,
  // shorter than the header, a magic that is not llm.c's, a version that does not go with its
  // magic, a negative token count, a size that disagrees with the count, a token id not below
  // `vocab` (with its position in the file), or one too large for int32.
  static TokenStream open(const std::vector<std::string>& paths, int64_t vocab = 0);

  TokenStream(TokenStream&&) noexcept;
  TokenStream& operator=(TokenStream&&) noexcept;
  ~TokenStream();

  int64_t size() const { return size_; }
  // The largest token id in the stream (-1 when it is empty).
  int64_t largest_token() const { return largest_; }
  const std::vector<std::string>& files() const { return files_; }

  // Copies tokens [begin, begin + out.size()) of the stream into `out` (across shard borders).
  // Throws Error when the range is not inside [0, size()).
  void copy(int64_t begin, std::span<int32_t> out) const;

  struct Shard;  // one mapped file (token_shards.cpp)

 private:
  TokenStream();
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<int64_t> starts_;  // starts_[i]: the stream position of shard i's first token
  std::vector<std::string> files_;
  int64_t size_ = 0;
  int64_t largest_ = -1;
};

// The files of one split of `dir`: the regular names matching *<split>*.bin (no leading dot, as a
// shell glob and Python's glob.glob match them), sorted by name. Throws Error (kData) when `dir`
// cannot be read.
std::vector<std::string> shard_files(const std::string& dir, const std::string& split);

// Both splits of a data directory and the run's vocabulary.
struct TokenShards {
  TokenStream train;
  TokenStream val;
  int64_t vocab = 0;
};

// Opens DIR/*train*.bin and DIR/*val*.bin. vocab: as shard_vocabulary's `given` (0: from the
// tokens of both splits). sequence_tokens (B*T): each split must hold at least one batch and
// its next token (B*T + 1 tokens). Throws Error (kData), one line: no train or no val shards in
// DIR, a split too short (naming its files), or any of TokenStream::open's.
TokenShards open_token_shards(const std::string& dir, int64_t vocab, int64_t sequence_tokens);

// Writes `tokens` as a shard at `path`: uint16 tokens (magic 20240520) unless `wide` (uint32,
// magic 20240801). Atomic: a temporary beside it, fsynced, renamed over `path`. Throws Error
// (kOutput) naming the path; a token that does not fit uint16 is a kUsage error.
void write_token_shard(const std::string& path, std::span<const uint32_t> tokens, bool wide = false);
// Bytes as tokens (vocabulary 256): the same file as the uint32 overload with each byte a token.
void write_token_shard(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace dtrain
