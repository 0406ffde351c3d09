// The settings ranks must share, their encoding, and the one-line report of a difference.
#include "app/rank_agreement.h"

#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/exchange.h"
#include "train/root_broadcast.h"

namespace dtrain {

namespace {

using Settings = std::vector<std::pair<std::string, std::string>>;

std::string encode(const Settings& settings) {
  std::string out;
  for (const auto& [flag, value] : settings) out += fmt::format("{}\t{}\n", flag, value);
  return out;
}

Settings decode(const std::string& text) {
  Settings settings;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.find('\t');
    settings.emplace_back(line.substr(0, tab), tab == std::string::npos ? "" : line.substr(tab + 1));
  }
  return settings;
}

// "rank 2 has" or "ranks 0,1 have".
std::string holders_text(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return fmt::format("rank {} has", ranks[0]);
  return fmt::format("ranks {} have", fmt::join(ranks, ","));
}

}  // namespace

Settings shared_settings(const TrainConfig& c, int64_t train_samples, int64_t test_samples) {
  const OptimizerSpec& o = c.optimizer;
  Settings s = {
      {"--model", model_kind_name(c.model.kind)},
      {"--hidden", fmt::format("{}", fmt::join(c.model.hidden, ","))},
      {"--width", fmt::format("{}", c.model.width)},
      {"--broadcast-buffers", c.ddp.broadcast_buffers ? "on" : "off"},
      {"--sync-bn", c.ddp.sync_batchnorm ? "on" : "off"},
      {"--dropout", fmt::format("{}", c.model.dropout)},
      {"--epochs", fmt::format("{}", c.epochs)},
      {"--batch-size", fmt::format("{}", c.batch_size)},
      {"--accumulate", fmt::format("{}", c.accumulate)},
      {"--pipeline-stages", fmt::format("{}", c.pipeline.stages)},
      {"--micro-batches", fmt::format("{}", c.pipeline.micro_batches)},
      {"--pipeline-schedule", pipeline_schedule_name(c.pipeline.schedule)},
      {"--pipeline-split", fmt::format("{}", fmt::join(c.pipeline.split, ","))},
      {"--bucket-cap-mb", c.ddp.bucket_cap_auto ? std::string("auto")
                                                : fmt::format("{:.3g} ({} bytes)",
                                                              static_cast<double>(c.ddp.bucket_cap_bytes) / (1 << 20),
                                                              c.ddp.bucket_cap_bytes)},
      {"--comm-hook", comm_hook_name(c.ddp.comm_hook)},
      {"--zero", fmt::format("{}", c.ddp.zero_stage)},
      {"--find-unused-parameters", c.ddp.find_unused_parameters ? "on" : "off"},
      {"--amp", std::string(amp_name(c.amp))},
      {"--loss-scale", c.loss_scale.dynamic ? std::string("dynamic") : fmt::format("{}", c.loss_scale.init_scale)},
      {"--loss-scale-growth-interval", fmt::format("{}", c.loss_scale.growth_interval)},
      {"--optimizer", optimizer_name(o.kind)},
      {"--lr", fmt::format("{}", o.lr)},
      {"--momentum", fmt::format("{}", o.momentum)},
      {"--weight-decay", fmt::format("{}", o.weight_decay)},
      {"--lr-schedule", lr_schedule_name(c.lr_schedule)},
      {"--seed", fmt::format("{}", c.seed)},
      {"--shuffle", c.data.shuffle ? "on" : "off"},
      {"--sampler", sampler_tail_name(c.data.sampler)},
      {"--train-limit", fmt::format("{}", c.data.train_limit)},
      {"--test-limit", fmt::format("{}", c.data.test_limit)},
      {"--classes", fmt::format("{}", c.data.classes)},
      {"training samples (--data)", fmt::format("{}", train_samples)},
      {"test samples (--data)", fmt::format("{}", test_samples)},
      {"--log-interval", fmt::format("{}", c.output.log_interval)},
      {"--checkpoint-dir (set or not)", c.checkpoints.dir.empty() ? "unset" : "set"},
      {"--checkpoint-every", fmt::format("{}", c.checkpoints.every)},
      // Paths may differ (a copy on each node); whether one is given may not: the rank that
      // loads waits in a broadcast the others never join (a crash, not a hang or a line).
      {"--resume", c.checkpoints.resume == ResumeMode::kNone ? "unset"
                   : c.checkpoints.resume == ResumeMode::kAuto ? "auto" : "a path"},
      {"--init-weights (set or not)", c.checkpoints.init_weights.empty() ? "unset" : "set"},
      {"--trace (set or not)", c.output.trace_path.empty() ? "unset" : "set"},
      {"--timeout", fmt::format("{}", c.runtime.collective_timeout_s)},
  };
  s.emplace_back("--beta2", fmt::format("{}", o.beta2));
  s.emplace_back("--clip-grad-norm", fmt::format("{}", c.clip_grad_norm));
  s.emplace_back("--data-format", data_format_name(c.data.format));
  s.emplace_back("--class-weights", fmt::format("{}", fmt::join(c.class_weights, ",")));
  if (c.lm) {
    const LmSettings& lm = *c.lm;
    s[0].second = "gpt";
    for (const auto& [flag, value] :
         {std::pair{"--layers", lm.layers}, std::pair{"--heads", lm.heads}, std::pair{"--embd", lm.embd},
          std::pair{"--context", lm.context}, std::pair{"--vocab", lm.vocab}, std::pair{"--steps", lm.steps},
          std::pair{"--warmup-steps", c.warmup_steps}, std::pair{"--eval-every", lm.eval_every},
          std::pair{"--eval-batches", lm.eval_batches}})
      s.emplace_back(flag, fmt::format("{}", value));
    s.emplace_back("--min-lr", fmt::format("{}", c.min_lr));
  }
  return s;
}

std::string first_disagreement(const std::vector<std::string>& all) {
  std::vector<Settings> decoded;
  for (const std::string& text : all) decoded.push_back(decode(text));
  const Settings& first = decoded.at(0);
  for (size_t i = 0; i < first.size(); ++i) {
    std::map<std::string, std::vector<int>> holders;  // value -> ranks
    std::vector<std::string> order;                   // values in order of the lowest rank
    for (size_t r = 0; r < decoded.size(); ++r) {
      const std::string value = i < decoded[r].size() && decoded[r][i].first == first[i].first
                                    ? decoded[r][i].second
                                    : "(a dtrain build that lists other settings)";
      if (!holders.count(value)) order.push_back(value);
      holders[value].push_back(static_cast<int>(r));
    }
    if (order.size() == 1) continue;
    std::vector<std::string> parts;
    for (const std::string& value : order) parts.push_back(fmt::format("{} {}", holders_text(holders[value]), value));
    return fmt::format("ranks disagree on {}: {} (every rank must be started with the same settings)", first[i].first,
                       fmt::join(parts, ", "));
  }
  return {};
}

void check_ranks_agree(Communicator& control, const Settings& settings) {
  if (control.size() == 1) return;
  const std::string problem = first_disagreement(allgather_strings(control, encode(settings)));
  if (!problem.empty()) throw AgreedError(problem, ErrorKind::kUsage);  // the same start fails the same way
}

}  // namespace dtrain
