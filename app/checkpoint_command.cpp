// `dtrain checkpoint consolidate`: its flags and its one summary line; the work is
// checkpoint/optimizer_shards.h's consolidate().
#include "app/checkpoint_command.h"

#include <fmt/format.h>

#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/optimizer_shards.h"
#include "core/command_line.h"
#include "core/error.h"

namespace dtrain {
namespace {

cxxopts::Options make_consolidate_options() {
  cxxopts::Options o("dtrain checkpoint consolidate",
                     "The full optimizer state of a checkpoint saved in shards (--zero) as one file, laid out as an "
                     "unsharded checkpoint's optimizer.safetensors (PyTorch's names), written tensor by tensor.\n"
                     "  dtrain checkpoint consolidate ckpt -o adamw.safetensors");
  // clang-format off
  o.add_options()
    ("o,output", "File to write (default: optimizer.safetensors here; replaced atomically)", cxxopts::value<std::string>())
    ("dir", "A checkpoint (DIR/step-<N>) or a checkpoint folder (its latest)", cxxopts::value<std::vector<std::string>>())
    ("h,help", "Show this help");
  // clang-format on
  o.parse_positional({"dir"});
  o.positional_help("DIR");
  return o;
}

}  // namespace

ParsedConsolidate parse_consolidate_options(const std::vector<std::string>& args) {
  cxxopts::Options options = make_consolidate_options();
  const ParsedFlags flags = parse_flags(options, args);
  ParsedConsolidate out;
  if (flags.help) {
    out.help = true;
    out.help_text = flags.help_text;
    return out;
  }
  const cxxopts::ParseResult& r = flags.result;
  if (!r.count("dir") || r["dir"].as<std::vector<std::string>>().size() != 1)
    throw UsageError("checkpoint consolidate: expected one checkpoint folder (dtrain checkpoint consolidate DIR [-o FILE])");
  out.config.dir = r["dir"].as<std::vector<std::string>>().front();
  if (r.count("output")) out.config.out = r["output"].as<std::string>();
  if (out.config.out.empty()) throw UsageError("-o: expected a file, got ''");
  return out;
}

std::string run_consolidate(const ConsolidateConfig& c) {
  const checkpoint::LoadedCheckpoint loaded =
      classify_errors(ErrorKind::kCheckpoint, [&] { return checkpoint::read_checkpoint(c.dir); });
  if (!loaded.optimizer.sharded())
    throw Error(fmt::format("{}: the optimizer state is not sharded ({} holds it whole already)", loaded.path.string(),
                            loaded.optimizer.sources().front()),
                ErrorKind::kUsage);
  if (!loaded.optimizer.nonfinite().empty()) throw Error(loaded.optimizer.nonfinite(), ErrorKind::kCheckpoint);
  const uint64_t bytes = classify_errors(ErrorKind::kOutput, [&] { return checkpoint::consolidate(loaded.optimizer, c.out); });
  return fmt::format("{}: the optimizer state of {} from {} shards: {} tensors, {} counts, {} bytes", c.out,
                     loaded.path.string(), loaded.state.optimizer_shards, loaded.optimizer.tensors().size(),
                     loaded.optimizer.counts().size(), bytes);
}

}  // namespace dtrain
