#include "app/reporter.h"

#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/cpu_blas.h"
#include "core/version.h"
#include "model/loss.h"

namespace dtrain {

Reporter::Reporter(const OutputSettings& output, bool rank_zero) : output_(output), rank_zero_(rank_zero) {}

void Reporter::start(Runtime& rt, const std::string& model, const TrainConfig& c, int64_t train_size,
                     int64_t test_size) {
  dataset_size_ = train_size;
  summary_model_ = model_kind_name(c.model.kind);
  summary_hidden_ = fmt::format("{}", fmt::join(c.model.hidden, ","));
  summary_hook_ = comm_hook_name(c.ddp.comm_hook);
  summary_batch_ = c.batch_size;
  summary_epochs_ = c.epochs;
  if (!output_.quiet && rt.local_rank() == 0) fmt::print("rank {}: {}\n", rt.rank(), rt.device_note());
  if (!logs()) return;
  const std::string grads = rt.size() == 1 ? "no gradient sync (1 rank)" : "gradients over " + rt.gradients().describe();
  fmt::print("dtrain: {} on {} rank(s), device {}, {}, {} BLAS thread(s)/rank ({} kernels), batch {}/rank, "
             "{} train / {} test samples\n",
             model, rt.size(), rt.device().str(), grads, rt.cpu_threads(), blas_corename(), c.batch_size,
             train_size, test_size);
  if (c.amp == AmpMode::kBf16)
    fmt::print("dtrain: amp bf16: Linear matmuls take bf16 operands with float32 accumulation; float32 master "
               "weights and gradients{}\n",
               rt.device().is_cpu() ? " (emulated on CPU: bf16-rounded operands through the float32 GEMM, for the "
                                      "numerics, not for speed)"
                                    : "");
}

void Reporter::start_epoch(int64_t, int64_t batches) { batches_ = batches; }

void Reporter::after_step(int64_t epoch, int64_t batch, int64_t samples_before, const Tensor& loss, float,
                          const BackwardTiming*) {
  if (!logs() || batch % output_.log_interval != 0) return;
  fmt::print("Train Epoch: {} [{}/{} ({:.0f}%)] Loss: {:.6f}\n", epoch + 1, samples_before, dataset_size_,
             100.0 * static_cast<double>(batch) / static_cast<double>(batches_), loss_value(loss));
}

void Reporter::end_epoch(int64_t epoch, const Evaluation& eval, int64_t test_size, int64_t samples, double seconds,
                         int world_size) {
  if (!logs()) return;
  fmt::print("{}\n", test_set_line(eval, test_size));
  fmt::print("Epoch {}: {:.1f} samples/s ({} samples in {:.2f} s on {} rank(s))\n", epoch + 1,
             static_cast<double>(samples) / seconds, samples, seconds, world_size);
}

void Reporter::note(const std::string& line) {
  if (logs() && !line.empty()) fmt::print("{}\n", line);
}

void Reporter::trace_written(const std::string& path, size_t spans, double overlap, double allreduce_ns) {
  if (!logs()) return;
  fmt::print("trace: wrote {} ({} spans on rank 0); all-reduce time overlapping backward: {:.1f}% of {:.1f} ms\n",
             path, spans, 100.0 * overlap, allreduce_ns / 1e6);
}

void Reporter::finish(const TrainResult& r) {
  if (rank_zero_ && output_.json) {
    const nlohmann::json summary = {
        {"dtrain", DTRAIN_VERSION},        {"np", r.world_size},
        {"device", r.device},              {"model", summary_model_},
        {"hidden", summary_hidden_},       {"batch_per_rank", summary_batch_},
        {"epochs", summary_epochs_},       {"comm_hook", summary_hook_},
        {"samples_per_s", r.samples_per_second}, {"train_s", r.train_seconds},
        {"test_acc", r.test_accuracy},     {"allreduce_overlap", r.allreduce_overlap}};
    fmt::print("{}\n", summary.dump());
  }
  std::fflush(stdout);
}

}  // namespace dtrain
