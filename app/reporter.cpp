#include "app/reporter.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/cpu_blas.h"
#include "core/error.h"
#include "core/version.h"
#include "model/loss.h"

namespace dtrain {

namespace {

double seconds_between(int64_t from_ns, int64_t to_ns) { return static_cast<double>(to_ns - from_ns) / 1e9; }

}  // namespace

void AllreduceStats::add(const BackwardTiming& t) {
  wait_s += seconds_between(t.end_ns, t.synced_ns);
  for (const BucketTiming& b : t.buckets) {
    allreduce_s += seconds_between(b.started_ns, b.finished_ns);
    const int64_t overlap_end = std::min(b.finished_ns, t.end_ns);
    if (overlap_end > b.started_ns) overlapped_s += seconds_between(std::max(b.started_ns, t.start_ns), overlap_end);
  }
}

Reporter::Reporter(const OutputSettings& output, bool rank_zero, bool progress)
    : output_(output), rank_zero_(rank_zero), out_(STDOUT_FILENO) {
  if (!rank_zero_) return;
  if (progress && !output_.quiet) progress_ = std::make_unique<ProgressLine>(stdout);
  if (!output_.metrics_path.empty()) {
    metrics_ = std::fopen(output_.metrics_path.c_str(), "w");
    if (!metrics_)
      throw Error(fmt::format("{}: cannot create: {}", output_.metrics_path, std::strerror(errno)), ErrorKind::kOutput);
  }
}

Reporter::~Reporter() {
  if (metrics_) std::fclose(metrics_);
}

void Reporter::start(Runtime& rt, const std::string& model, const TrainConfig& c, int64_t train_size,
                     int64_t test_size) {
  dataset_size_ = train_size;
  epochs_ = c.epochs;
  summary_model_ = model_kind_name(c.model.kind);
  // The model's size: the MLP's hidden widths, resnet18's base width ("width 16").
  summary_hidden_ = c.model.kind == ModelKind::kResnet18 ? fmt::format("width {}", c.model.width)
                                                          : fmt::format("{}", fmt::join(c.model.hidden, ","));
  summary_hook_ = comm_hook_name(c.ddp.comm_hook);
  summary_batch_ = c.batch_size;
  run_start_ = Clock::now();
  std::fflush(stdout);  // what was printed before through stdio comes first
  if (!output_.quiet && rt.local_rank() == 0) print(fmt::format("rank {}: {}\n", rt.rank(), rt.device_note()));
  if (!logs()) return;
  const std::string grads = rt.size() == 1 ? "no gradient sync (1 rank)" : "gradients over " + rt.gradients().describe();
  print(fmt::format("dtrain: {} on {} rank(s), device {}, {}, {} BLAS thread(s)/rank ({} kernels), batch {}/rank, "
                    "{} train / {} test samples\n",
                    model, rt.size(), rt.device().str(), grads, rt.cpu_threads(), blas_corename(), c.batch_size,
                    train_size, test_size));
  amp_line(rt, c);
}

void Reporter::amp_line(Runtime& rt, const TrainConfig& c) {
  if (c.amp == AmpMode::kOff || !logs()) return;
  const std::string_view name = amp_name(c.amp);
  const GradScalerSettings& ls = c.loss_scale;
  print(fmt::format("dtrain: amp {}: Linear and Conv matmuls take {} operands with float32 accumulation; float32 "
                    "master weights and gradients{}{}\n",
                    name, name,
                    c.amp != AmpMode::kFp16 ? std::string()
                    : ls.dynamic ? fmt::format("; dynamic loss scale from {:g} (x{:g} after {} good steps, x{:g} and "
                                               "the step skipped on an inf/NaN gradient)",
                                               ls.init_scale, ls.growth_factor, ls.growth_interval, ls.backoff_factor)
                                 : fmt::format("; fixed loss scale {:g} (a step with an inf/NaN gradient is skipped)",
                                               ls.init_scale),
                    rt.device().is_cpu() ? fmt::format(" (emulated on CPU: {}-rounded operands through the float32 "
                                                       "GEMM, for the numerics, not for speed)",
                                                       name)
                                         : ""));
}

void Reporter::add_loss_scale(nlohmann::json& record) const {
  if (!loss_scale_) return;
  record["loss_scale"] = loss_scale_->scale;
  record["skipped_steps"] = loss_scale_->skipped_steps;
}

namespace {

// " Scale: 65536 Skipped: 2" after the seeds' loss (--amp fp16), else "".
std::string scale_suffix(const GradScalerState* s) {
  return s ? fmt::format(" Scale: {:g} Skipped: {}", s->scale, s->skipped_steps) : "";
}

}  // namespace

void Reporter::start_epoch(int64_t, int64_t batches, int64_t samples_in_epoch) {
  batches_ = batches;
  samples_in_epoch_ = samples_in_epoch;
  epoch_start_ = interval_start_ = Clock::now();
  interval_samples_ = 0;
  interval_ = {};
}

void Reporter::after_step(int64_t epoch, int64_t batch, int64_t samples_before, int64_t batch_samples,
                          const Tensor& loss, float lr, const BackwardTiming* timing) {
  if (!rank_zero_) return;
  ++global_step_;
  samples_run_ += batch_samples;
  interval_samples_ += batch_samples;
  if (timing) interval_.add(*timing);
  const bool interval_ends = batch % output_.log_interval == 0;
  const bool redraw = progress_ && progress_->due(batch + 1 == batches_);
  if (!interval_ends && !redraw) return;
  const float loss_now = loss_value(loss);  // a device-to-host copy: only when it is shown or written
  if (interval_ends && logs() && !progress_)
    print(fmt::format("Train Epoch: {} [{}/{} ({:.0f}%)] Loss: {:.6f}{}\n", epoch + 1, samples_before, dataset_size_,
                      100.0 * static_cast<double>(batch) / static_cast<double>(batches_), loss_now,
                      scale_suffix(loss_scale_)));
  if (interval_ends && metrics_) write_step_record(epoch, batch, samples_before + batch_samples, loss_now, lr);
  if (redraw) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - epoch_start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(samples_before + batch_samples) / elapsed : 0;
    const double left = static_cast<double>(samples_in_epoch_ * (epochs_ - epoch) - samples_before - batch_samples);
    progress_->draw({epoch + 1, epochs_, samples_before + batch_samples, samples_in_epoch_, rate, loss_now,
                     rate > 0 ? left / rate : 0});
  }
}

void Reporter::write_step_record(int64_t epoch, int64_t batch, int64_t samples, float loss, float lr) {
  const auto now = Clock::now();
  const double seconds = std::chrono::duration<double>(now - interval_start_).count();
  nlohmann::json record = {
      {"type", "step"},
      {"epoch", epoch + 1},
      {"batch", batch},
      {"step", global_step_},
      {"samples", samples_run_},
      {"epoch_samples", samples},
      {"loss", loss},
      {"lr", lr},
      {"samples_per_s", seconds > 0 ? static_cast<double>(interval_samples_) / seconds : 0},
      {"allreduce_wait_s", interval_.wait_s},
      {"allreduce_s", interval_.allreduce_s},
      {"allreduce_overlap", interval_.allreduce_s > 0 ? interval_.overlapped_s / interval_.allreduce_s : 0}};
  add_loss_scale(record);
  metrics_record(std::move(record));
  interval_start_ = now;
  interval_samples_ = 0;
  interval_ = {};
}

void Reporter::metrics_record(nlohmann::json record) {
  if (!metrics_) return;
  record["time_s"] = std::chrono::duration<double>(Clock::now() - run_start_).count();
  fmt::print(metrics_, "{}\n", record.dump());
  std::fflush(metrics_);
}

void Reporter::end_epoch(int64_t epoch, const Evaluation& eval, int64_t test_size, int64_t samples, double seconds,
                         int world_size) {
  if (!rank_zero_) return;
  if (progress_) progress_->finish();
  if (metrics_) {
    nlohmann::json record = {{"type", "epoch"},
                                   {"epoch", epoch + 1},
                                   {"step", global_step_},
                                   {"samples", samples_run_},
                                   {"test_loss", eval.loss},
                                   {"test_accuracy", eval.accuracy},
                                   {"samples_per_s", static_cast<double>(samples) / seconds},
                                   {"epoch_s", seconds}};
    add_loss_scale(record);
    metrics_record(std::move(record));
  }
  if (!logs()) return;
  print(fmt::format("{}\nEpoch {}: {:.1f} samples/s ({} samples in {:.2f} s on {} rank(s))\n",
                    test_set_line(eval, test_size), epoch + 1, static_cast<double>(samples) / seconds, samples, seconds,
                    world_size));
}

namespace {

// 4114 -> "4,114": llm.c's and PyTorch users' tokens/s, readable at a glance.
std::string thousands(double value) {
  const std::string digits = fmt::format("{:.0f}", value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    const size_t left = digits.size() - i;  // digits from here to the end
    if (i > 0 && digits[i - 1] != '-' && left % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

void Reporter::start_lm(Runtime& rt, const std::string& model, const TrainConfig& c, int64_t train_tokens,
                        int64_t val_tokens, int64_t parameters) {
  summary_model_ = "gpt";
  summary_hook_ = comm_hook_name(c.ddp.comm_hook);
  summary_batch_ = c.batch_size;
  run_start_ = interval_start_ = Clock::now();
  std::fflush(stdout);
  if (!output_.quiet && rt.local_rank() == 0) print(fmt::format("rank {}: {}\n", rt.rank(), rt.device_note()));
  if (!logs()) return;
  const std::string grads = rt.size() == 1 ? "no gradient sync (1 rank)" : "gradients over " + rt.gradients().describe();
  print(fmt::format("dtrain: {} ({} parameters) on {} rank(s), device {}, {}, {} BLAS thread(s)/rank, batch {}x{} "
                    "tokens/rank, {} train / {} val tokens\n",
                    model, thousands(static_cast<double>(parameters)), rt.size(), rt.device().str(), grads,
                    rt.cpu_threads(), c.batch_size, c.lm->context, train_tokens, val_tokens));
  amp_line(rt, c);
}

void Reporter::lm_step(const LmStep& s) {
  if (!rank_zero_) return;
  if (logs() && !progress_)
    print(fmt::format("step {}/{} | loss {:.4f} | {}{}lr {:.2e} | {:.0f} ms | {} tokens/s\n", s.step, s.steps, s.loss,
                      s.norm >= 0 ? fmt::format("norm {:.4f} | ", s.norm) : "",
                      loss_scale_ ? fmt::format("scale {:g} ({} skipped) | ", loss_scale_->scale,
                                                loss_scale_->skipped_steps)
                                  : "",
                      s.lr, s.step_ms, thousands(s.tokens_per_s)));
  if (!metrics_) return;
  nlohmann::json record = {{"type", "step"},       {"step", s.step},
                           {"loss", s.loss},       {"lr", s.lr},
                           {"step_ms", s.step_ms}, {"tokens_per_s", s.tokens_per_s}};
  if (s.norm >= 0) record["norm"] = s.norm;
  add_loss_scale(record);
  metrics_record(std::move(record));
}

void Reporter::lm_progress(const LmProgressState& state, const Tensor& loss) {
  if (!progress_ || !progress_->due(state.step == state.steps)) return;
  LmProgressState shown = state;
  shown.loss = loss_value(loss);  // a device-to-host copy: only when the line is redrawn
  progress_->draw(shown);
}

void Reporter::lm_eval(int64_t step, double val_loss) {
  if (!rank_zero_) return;
  if (progress_) progress_->finish();  // the val line below the progress line, which goes on under it
  if (logs()) print(fmt::format("val loss {:.4f}\n", val_loss));
  metrics_record({{"type", "eval"}, {"step", step}, {"val_loss", val_loss}});
}

void Reporter::finish_lm(const TrainResult& r) {
  if (progress_) progress_->finish();
  if (!rank_zero_ || !output_.json) return;
  const nlohmann::json summary = {{"dtrain", DTRAIN_VERSION},
                                  {"np", r.world_size},
                                  {"world_size", r.world_size},
                                  {"device", r.device},
                                  {"model", "gpt"},
                                  {"parameters", r.parameters},
                                  {"batch_per_rank", summary_batch_},
                                  {"steps", r.global_step},
                                  {"comm_hook", summary_hook_},
                                  {"tokens_per_s", r.tokens_per_second},
                                  {"train_s", r.train_seconds},
                                  {"train_loss", r.train_loss},
                                  {"val_loss", r.val_loss},
                                  {"allreduce_overlap", r.allreduce_overlap},
                                  // The logger's final parameters (a pipeline's: its last stage's).
                                  {"parameters_fingerprint", fmt::format("{:016x}", r.parameters_fingerprint)}};
  print(summary.dump() + "\n");
}

void Reporter::note(const std::string& line) {
  if (logs() && !line.empty()) print(line + "\n");
}

void Reporter::trace_written(const std::string& path, size_t spans, double overlap, double allreduce_ns) {
  if (!logs()) return;
  print(fmt::format(
      "trace: wrote {} ({} spans on rank 0); all-reduce time overlapping backward: {:.1f}% of {:.1f} ms\n", path,
      spans, 100.0 * overlap, allreduce_ns / 1e6));
}

void Reporter::finish(const TrainResult& r) {
  if (rank_zero_ && output_.json) {
    const nlohmann::json summary = {{"dtrain", DTRAIN_VERSION},
                                    {"np", r.world_size},
                                    {"device", r.device},
                                    {"model", summary_model_},
                                    {"hidden", summary_hidden_},
                                    {"batch_per_rank", summary_batch_},
                                    {"epochs", epochs_},
                                    {"comm_hook", summary_hook_},
                                    {"samples_per_s", r.samples_per_second},
                                    {"train_s", r.train_seconds},
                                    {"test_acc", r.test_accuracy},
                                    {"allreduce_overlap", r.allreduce_overlap},
                                    // Rank 0's final parameters (model/fingerprint.h): equal runs, equal bits.
                                    {"parameters_fingerprint", fmt::format("{:016x}", r.parameters_fingerprint)}};
    print(summary.dump() + "\n");
  }
}

}  // namespace dtrain
