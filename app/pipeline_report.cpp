#include "app/pipeline_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/exchange.h"
#include "model/fingerprint.h"

namespace dtrain {

void trace_pipeline_step(Tracer& tracer, const PipelineStage& stage) {
  if (!tracer.enabled()) return;
  for (const PipeSpan& s : stage.last_step_spans())
    tracer.add(s.kind == PipeSpan::kTransfer
                   ? std::string("send/recv")
                   : fmt::format("{} {}", s.kind == PipeSpan::kForward ? "forward" : "backward", s.micro_batch),
               s.kind == PipeSpan::kTransfer ? "comm" : "compute", s.kind == PipeSpan::kTransfer ? 1 : 0, s.start_ns,
               s.end_ns);
}

void report_pipeline_figures(Reporter& reporter, Communicator& world, const PipelineStage& stage,
                             const PipelineSettings& p) {
  struct StageFigures {
    int64_t busy_ns, step_ns;
    int32_t peak_held, pad;
  };
  const std::vector<StageFigures> all =
      allgather_values(world, StageFigures{stage.busy_ns(), stage.step_ns(), stage.peak_held_inputs(), 0});
  std::string idle, held;
  nlohmann::json idle_shares = nlohmann::json::array(), held_inputs = nlohmann::json::array();
  for (int s = 0; s < p.stages; ++s) {
    const StageFigures& f = all[static_cast<size_t>(s)];  // world rank s: stage s of replica 0
    const double share = f.step_ns > 0 ? 1.0 - double(f.busy_ns) / double(f.step_ns) : 0.0;
    idle += fmt::format("{}{:.1f}%", s ? ", " : "", 100.0 * share);
    held += fmt::format("{}{}", s ? ", " : "", f.peak_held);
    idle_shares.push_back(share);
    held_inputs.push_back(f.peak_held);
  }
  const PipelineGrid& grid = stage.grid();
  reporter.metrics_record({{"type", "pipeline"},
                           {"stages", grid.stages},
                           {"replicas", grid.replicas},
                           {"micro_batches", p.micro_batches},
                           {"schedule", pipeline_schedule_name(p.schedule)},
                           {"idle_share", idle_shares},
                           {"bubble", double(p.stages - 1) / double(p.micro_batches + p.stages - 1)},
                           {"peak_held_inputs", held_inputs}});
  reporter.note(fmt::format("pipeline: idle share per stage {} (the bubble (P-1)/(M+P-1) is {:.1f}%; the rest is "
                            "transfers and recomputation's imbalance); micro-batch inputs held at the peak per stage {} "
                            "(gpipe: M, 1f1b: at most P - s)",
                            idle, 100.0 * (p.stages - 1) / (p.micro_batches + p.stages - 1), held));
}

uint64_t pipeline_fingerprint(Communicator& world, PipelineStage& stage, int stages) {
  const std::vector<uint64_t> all = allgather_values(world, parameters_fingerprint(stage.module()));
  return fingerprint_bytes(all.data(), sizeof(uint64_t) * static_cast<size_t>(stages));  // replica 0's stages
}

}  // namespace dtrain
