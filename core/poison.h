// The process-wide mark that one of this process's collectives failed or timed out, and why.
//
// Note [A poisoned step is never saved]: when a collective hangs or fails, its result (and so
// every parameter computed from it) may be wrong: an aborted NCCL all-reduce returns partial
// sums, and its kernels return early while the compute stream carries on. The watchdog that
// finds it (comm/nccl/nccl_watchdog.h, comm/collective_watchdog.h) marks the process here
// before it does anything else — before printing, dumping or exiting — and the checkpoint
// writer looks here right before each step that would make a save visible (the step folder's
// rename, `latest`), so no checkpoint written by this process after the mark can be resumed
// from. A collective that returns a wrong result only after its watchdog fired thus can never
// reach a checkpoint. Plain C++ (no MPI, no CUDA), so it is tested on CPU.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace dtrain {

// Marks this process poisoned; the first reason is kept ("NCCL allreduce #42 timed out after
// 600.0s"). Thread-safe; never throws (a reason that cannot be copied is kept as "unknown").
void poison_process(std::string_view reason) noexcept;

// "" while the process is not poisoned; otherwise the first reason.
std::string process_poison();

// Runs `publish` (a rename that makes a save visible) only while the process is not poisoned,
// and returns false without running it otherwise. The mark's lock is held across the check
// and the call, so a poison_process() racing it waits for the rename: none becomes visible
// after the mark.
bool publish_unless_poisoned(const std::function<void()>& publish);

// Tests only: forgets the mark (tests of one binary share the process).
void clear_process_poison_for_tests();

}  // namespace dtrain
