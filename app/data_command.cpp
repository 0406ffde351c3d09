// `dtrain data shard`: its flags and its one summary line; the work is data/byte_shards.h's.
#include "app/data_command.h"

#include <fmt/format.h>

#include "core/command_line.h"
#include "core/error.h"

namespace dtrain {
namespace {

cxxopts::Options make_data_shard_options() {
  cxxopts::Options o("dtrain data shard",
                     "Byte-level llm.c token shards (vocabulary 256) from text files or folders (*.py *.txt *.md *.rst "
                     "*.h *.c in folders, walked in name order): DIR/bytes_val_000000.bin and "
                     "DIR/bytes_train_%06d.bin, as shared/peers/llmc_shards.py writes them.\n"
                     "  dtrain data shard --bytes /usr/lib/python3.11 -o /tmp/pystd");
  // clang-format off
  o.add_options()
    ("bytes", "Tokens are the bytes of the text (the one tokenizer dtrain has; required)")
    ("o,output", "Folder to write the shards to (made when missing)", cxxopts::value<std::string>())
    ("val-fraction", "Share of the bytes, from the start, for validation (default: 1/20, at most 1 MiB)", cxxopts::value<double>())
    ("paths", "Text files or folders", cxxopts::value<std::vector<std::string>>())
    ("h,help", "Show this help");
  // clang-format on
  o.parse_positional({"paths"});
  o.positional_help("PATH...");
  return o;
}

}  // namespace

ParsedDataShard parse_data_shard_options(const std::vector<std::string>& args) {
  cxxopts::Options options = make_data_shard_options();
  const ParsedFlags flags = parse_flags(options, args);
  ParsedDataShard out;
  if (flags.help) {
    out.help = true;
    out.help_text = flags.help_text;
    return out;
  }
  const cxxopts::ParseResult& r = flags.result;
  if (!r.count("bytes")) throw UsageError("--bytes: required (byte-level shards are the only kind dtrain writes)");
  if (!r.count("paths")) throw UsageError("data shard: expected text files or folders (dtrain data shard --bytes PATH... -o DIR)");
  if (!r.count("output")) throw UsageError("-o: required (the folder to write the shards to)");
  DataShardConfig& c = out.config;
  c.paths = r["paths"].as<std::vector<std::string>>();
  c.out_dir = r["output"].as<std::string>();
  if (c.out_dir.empty()) throw UsageError("-o: expected a folder, got ''");
  if (r.count("val-fraction")) {
    const double f = r["val-fraction"].as<double>();
    if (!(f > 0 && f < 1)) throw UsageError(fmt::format("--val-fraction: must be above 0 and below 1, got {}", f));
    c.val_fraction = f;
  }
  return out;
}

std::string run_data_shard(const DataShardConfig& c) {
  const ByteShardSummary s = write_byte_shards(c.paths, c.out_dir, c.val_fraction);
  const size_t train_shards = s.files.size() - 1;
  std::string line = fmt::format("{}: {} train and {} val tokens (bytes, vocabulary 256) in {} train shard{} and 1 val shard",
                                 c.out_dir, s.train_tokens, s.val_tokens, train_shards, train_shards == 1 ? "" : "s");
  if (!s.removed.empty())
    line += fmt::format("; removed {} train shard{} of an earlier run", s.removed.size(), s.removed.size() == 1 ? "" : "s");
  return line;
}

}  // namespace dtrain
