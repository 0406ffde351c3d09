#include "app/run_control.h"

#include <cstdio>
#include <vector>

#include <fmt/format.h>

#include "app/checkpointing.h"
#include "checkpoint/finite.h"
#include "comm/exchange.h"

namespace dtrain {

RunControl::RunControl(Runtime& runtime, const TrainConfig& c, Module& model, const Optimizer& optimizer,
                       Reporter& reporter, safetensors::Metadata architecture, Callbacks callbacks)
    : rt_(runtime),
      c_(c),
      model_(model),
      optimizer_(optimizer),
      reporter_(reporter),
      architecture_(std::move(architecture)),
      callbacks_(std::move(callbacks)),
      saver_(runtime.control(), checkpointer_options(c.checkpoints)),
      stop_vote_(runtime.control()),
      loss_watch_(runtime.device(), runtime.device().is_cpu(), kVotePeriodMs) {}

std::optional<ResumedRun> RunControl::read_starting_point(Optimizer& optimizer, DistributedDataParallel* ddp) {
  const CheckpointSettings& k = c_.checkpoints;
  // Whatever fails in reading, checking or loading them is about the files (a damaged one, one
  // made for another model or run): a restart would fail the same way.
  std::optional<ResumedRun> resumed = classify_errors(ErrorKind::kCheckpoint, [&] {
    return restore_checkpoint(rt_.control(), c_, model_, optimizer, ddp);
  });
  if (!resumed && !k.init_weights.empty())
    classify_errors(ErrorKind::kCheckpoint, [&] { load_initial_weights(rt_.control(), k.init_weights, model_); });
  return resumed;
}

void RunControl::announce_start(const std::optional<ResumedRun>& resumed, DistributedDataParallel* ddp) {
  const CheckpointSettings& k = c_.checkpoints;
  if (!resumed) {
    if (k.resume == ResumeMode::kAuto)
      reporter_.note(fmt::format("resume: no checkpoint in {} (no {}/latest, no step-<N>): starting fresh", k.dir, k.dir));
    if (!k.init_weights.empty()) reporter_.note(fmt::format("initial weights: {}", k.init_weights));
    return;
  }
  if (ddp && resumed->buckets) {
    reporter_.note(fmt::format("resume: buckets from the checkpoint ({:g} MiB first bucket, {:g} MiB cap)",
                               static_cast<double>(resumed->buckets->first_bucket_bytes) / (1 << 20),
                               static_cast<double>(resumed->buckets->bucket_cap_bytes) / (1 << 20)));
  }
  last_saved_step_ = resumed->state.global_step;
  newest_checkpoint_ = resumed->path;
  if (!resumed->chosen_because.empty()) reporter_.note("resume: " + resumed->chosen_because);
}

void RunControl::begin_step() {
  step_start_ = std::chrono::steady_clock::now();
  writing_ = saver_.writing();
}

void RunControl::end_step(const StepPlace& at) {
  last_step_ = at;
  saver_.record_step(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - step_start_).count(),
                     writing_);
}

bool RunControl::at_step_boundary(const Boundary& b) {
  const CheckpointSettings& k = c_.checkpoints;
  const bool can_save = !k.dir.empty() && b.can_save && b.global_step != last_saved_step_;
  const bool save_due = can_save && (b.run_end || b.due);
  // Every rank reaches the same boundaries, so every rank votes at each (Note [Agreeing to
  // stop]); always where a checkpoint is due and at the end (Note [Stopping on non-finite values]).
  if (!stop_vote_.votes_here(save_due || b.run_end)) return true;
  // A run that saves nothing has its parameters checked once, at its end: NaN weights can give a
  // finite loss (ReLU of NaN is 0), and the run must not end with exit 0 on them.
  Verdict verdict = vote(save_due, save_due || b.run_end, b.run_end && !save_due);
  if (verdict.nonfinite_ranks > 0) return diverge(), false;
  const int signal = b.run_end ? 0 : verdict.signal;  // the run ends here anyway, with its checkpoint
  if (signal != 0 && can_save && !save_due) {
    // A stop saves where it is: the ranks vote again, on the snapshot this time.
    if (vote(true, true).nonfinite_ranks > 0) return diverge(), false;
    write_checkpoint(b.global_step);
  } else if (save_due) {
    write_checkpoint(b.global_step);
  }
  if (signal != 0) return stop(signal, b.global_step), false;
  return true;
}

Verdict RunControl::vote(bool snapshot, bool must_read, bool check_parameters) {
  if (snapshot) {
    rt_.compute_stream().synchronize();  // the snapshot reads what the last step wrote
    snapshot_problem_ = saver_.snapshot(callbacks_.state(), model_, optimizer_, architecture_);
  } else if (check_parameters && rt_.rank() == 0) {  // the replicas are identical: rank 0 speaks for all
    rt_.compute_stream().synchronize();
    std::vector<safetensors::HostTensor> copies;
    for (Parameter* p : model_.parameters()) copies.push_back(safetensors::host_copy(p->name, p->value));
    if (const std::string bad = checkpoint::first_nonfinite_tensor(copies); !bad.empty())
      snapshot_problem_ = "parameter " + bad;
  }
  const bool nonfinite = loss_watch_.check(must_read).found || !snapshot_problem_.empty();
  return stop_vote_.cast({StopSignals::received(), nonfinite});
}

void RunControl::write_checkpoint(int64_t global_step) {
  saver_.write();
  last_saved_step_ = global_step;
  newest_checkpoint_ = saver_.last_path();
  reporter_.note(fmt::format("checkpoint: {}{}", saver_.last_path(),
                             c_.checkpoints.background ? " (writing in the background)" : ""));
}

// A rank saw a non-finite value (Note [Stopping on non-finite values]): the snapshot is dropped,
// the save in flight (of finite values, voted on) completes, rank 0 prints what the ranks saw and
// every rank returns to exit with kDivergedExitStatus.
void RunControl::diverge() {
  diverged_ = true;
  saver_.discard();
  const std::vector<LossFinding> losses = allgather_values(rt_.control(), loss_watch_.check());
  saver_.wait();
  if (rt_.rank() == 0) {
    const std::string checkpoints =
        c_.checkpoints.dir.empty()       ? "nothing saved (no --checkpoint-dir)"
        : newest_checkpoint_.empty()     ? fmt::format("no checkpoint written from it (none in {} yet)", c_.checkpoints.dir)
                                         : fmt::format("no checkpoint written from it (newest: {})", newest_checkpoint_);
    std::fflush(stdout);
    fmt::print(stderr, "dtrain: error: {}\n", divergence_line(losses, snapshot_problem_, last_step_, checkpoints));
    std::fflush(stderr);
  }
  rt_.control().barrier();
}

// The ranks agreed to stop at this boundary: rank 0's checkpoint is complete before any rank
// exits (a launcher ends the job when the first rank does), then each returns to exit.
void RunControl::stop(int signal, int64_t global_step) {
  stopped_by_ = signal;
  saver_.wait();
  if (rt_.rank() == 0) {
    const std::string saved = c_.checkpoints.dir.empty() ? "nothing saved (no --checkpoint-dir)"
                              : last_saved_step_ != global_step
                                  ? fmt::format("{}; the newest is {}", callbacks_.no_save_here,
                                                saver_.last_path().empty() ? "none" : saver_.last_path())
                                  : fmt::format("checkpoint {} saved; continue with --resume auto", saver_.last_path());
    std::fflush(stdout);
    fmt::print(stderr, "dtrain: stopped by {} at {}; {}\n", signal_name(signal), callbacks_.where(), saved);
    std::fflush(stderr);
  }
  rt_.control().barrier();
}

void RunControl::finish() {
  saver_.wait();  // a failed background save fails the run here
  if (stopped_by_ == 0 && !diverged_) reporter_.note(saver_.summary());
}

void RunControl::write_trace(const Tracer& tracer, TrainResult& result) {
  if (!tracer.enabled()) return;
  const Tracer::Overlap o = tracer.write(c_.output.trace_path, rt_.control());
  result.allreduce_overlap = o.allreduce_ns > 0 ? o.overlapped_ns / o.allreduce_ns : 0.0;
  reporter_.trace_written(c_.output.trace_path, tracer.spans().size(), result.allreduce_overlap, o.allreduce_ns);
}

}  // namespace dtrain
