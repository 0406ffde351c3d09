// Byte-level token shards (vocabulary 256: a token is a byte) from text files, for users without a
// tokenizer: the files llm.c's format takes, written exactly as shared/peers/llmc_shards.py
// writes them (`dtrain data shard --bytes`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain {

// The suffixes of the files taken from a folder (llmc_shards.py's).
inline constexpr const char* kTextSuffixes[] = {".py", ".txt", ".md", ".rst", ".h", ".c"};
inline constexpr int64_t kByteShardTokens = 100'000'000;  // at most this many tokens per train shard
inline constexpr int64_t kByteValMax = int64_t{1} << 20;  // the default validation split's cap

// The text files `paths` name, in llmc_shards.py's order (os.walk, top-down): a file as given; a
// folder's own files ending in kTextSuffixes, sorted by name, then its subfolders in name order,
// each the same way (links to folders are listed, not walked; other files not regular are
// skipped). Throws Error (kData) naming a path that is missing, neither file nor folder, or a
// folder that cannot be read.
std::vector<std::string> text_files(const std::vector<std::string>& paths);

// How many of `total` bytes go to validation: floor(total * fraction) when given, else total / 20
// capped at kByteValMax (llmc_shards.py's rule). Pure.
int64_t validation_bytes(int64_t total, std::optional<double> fraction);

struct ByteShardSummary {
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::vector<std::string> files;  // written, val first
  std::vector<std::string> removed;  // stale bytes_train_NNNNNN.bin beyond the ones written
};

// Reads every text file of `paths` (text_files) into memory, concatenated, and writes
// out_dir/bytes_val_000000.bin (the first validation_bytes of them) and bytes_train_%06d.bin (the
// rest, kByteShardTokens each at most), each atomically; creates out_dir when missing; removes
// bytes_train_%06d.bin files of a larger earlier run, which would otherwise join the split.
// Throws Error: kData for unreadable input, no text at all, or a split (validation or training)
// under 2 tokens, which holds no (input, target) pair; then nothing is written. kOutput when out_dir cannot be
// written, kResources when the text does not fit in memory.
ByteShardSummary write_byte_shards(const std::vector<std::string>& paths, const std::string& out_dir,
                                   std::optional<double> val_fraction = std::nullopt);

}  // namespace dtrain
