// Runtime: everything a dtrain process sets up once, in one object. dtrain::init() makes it and
// its destructor shuts it down: the control communicator (MPI, or a one-rank world when the
// process was started alone), the gradient communicator (NCCL on multi-rank GPU runs, else the
// control communicator), the chosen and pinned device with its compute stream, and the CPU
// thread policy. DDP and the training loop take a Runtime; nothing else holds these.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/allreduce_algorithm.h"
#include "comm/communicator.h"
#include "comm/flight_recorder.h"
#include "core/device_select.h"
#include "core/thread_policy.h"

namespace dtrain {

struct RuntimeOptions {
  DeviceRequest device = DeviceRequest::automatic();
  bool allow_gpu_sharing = false;  // several local ranks on one GPU (local rank r -> GPU r mod count)
  bool tf32 = false;               // TF32 tensor cores for float32 GEMMs on GPU
  double collective_timeout_s = 600;  // every collective, CPU and GPU; PyTorch's default, 10 minutes; 0: none
  size_t flight_recorder_size = 2000;  // collectives each rank remembers (comm/flight_recorder.h)
  std::string flight_recorder_dir;     // where ranks write them on a timeout, an error or SIGUSR1
  bool debug_collectives = false;      // every MPI collective checks its header first (comm/collective_check.h)
  int cpu_threads = 0;  // BLAS threads per rank; 0: the thread policy's choice (core/thread_policy.h)
  // How MPI all-reduces on CPU (comm/allreduce_algorithm.h); GPU gradients go over NCCL.
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::kAuto;
  // NCCL collectives carry CUDA timing events, so traces and metrics get the device's times
  // (Note [Device-timed collectives] in comm/communicator.h); off, they cost no events.
  bool device_timing = false;
  // Sub-communicators will run beside the world's (a pipeline's grid): MPI starts with
  // MPI_THREAD_MULTIPLE (Note [Sub-communicators] in comm/communicator.h).
  bool concurrent_communicators = false;
};

class Runtime {
 public:
  ~Runtime();  // finishes issued collectives, destroys the communicators, finalises MPI if it started it
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return control_->rank(); }
  int size() const { return control_->size(); }
  int local_rank() const { return control_->local_rank(); }
  int local_size() const { return control_->local_size(); }

  // Host-memory collectives: metrics, checks, agreement between ranks.
  Communicator& control() { return *control_; }
  // The communicator for gradients and parameters in device memory.
  Communicator& gradients() { return gradients_ ? *gradients_ : *control_; }
  // The flight recorder of the gradient communicator when it is NCCL (null otherwise: MPI's
  // collectives are in the control communicator's).
  const FlightRecorder* gradients_flight_recorder() const { return gradients_log_.get(); }
  Device device() const { return device_; }
  Stream& compute_stream() { return dtrain::compute_stream(device_); }
  int cpu_threads() const { return cpu_threads_; }
  // Note [Pipeline on a GPU] (pipeline/grid.h): a communicator for device tensors over the ranks
  // of `group` (a sub-communicator of control()): on a GPU, NCCL bootstrapped over `group` (rank
  // 0's unique id broadcast there), with the gradient communicator's deadline and watchdog and a
  // flight recorder of its own, dumped as flight_recorder_rank<R>_<name>.json; null on CPU, where
  // `group` moves the tensors itself. Collective over `group`.
  std::unique_ptr<Communicator> device_communicator(Communicator& group, const std::string& name);
  // Why this device, in one line ("no CUDA device visible; using CPU (...)").
  const std::string& device_note() const { return device_note_; }
  // The CPU all-reduce algorithm and why ("hierarchical (auto: 4 rank(s) on 2 node(s), ...)").
  const std::string& allreduce_note() const { return allreduce_note_; }

 private:
  friend std::unique_ptr<Runtime> init(int* argc, char*** argv, const RuntimeOptions& options);
  Runtime() = default;
  void choose_device(const RuntimeOptions& options);
  void start_gradient_communicator(const RuntimeOptions& options);

  std::unique_ptr<Communicator> control_;
  std::unique_ptr<FlightRecorder> gradients_log_;  // NCCL's collectives; declared first: outlives gradients_
  // device_communicator()'s recorders: they outlive the communicators, which their callers own.
  std::vector<std::unique_ptr<FlightRecorder>> device_logs_;
  std::unique_ptr<Communicator> gradients_;  // only when it differs from control_
  Device device_;
  std::string device_note_;
  std::string allreduce_note_ = "flat (one rank)";
  CpuTopology topology_;
  int cpu_threads_ = 1;
  bool owns_mpi_ = false;
  RuntimeOptions options_;  // as init() was given them
};

// Starts dtrain in this process. Under a launcher (mpirun, srun, a PMI server): MPI with
// MPI_THREAD_SERIALIZED, the node-local rank and size cross-checked against the launcher's
// variables; started alone: a one-rank world without MPI. Then the device (every rank must take
// the same path: all GPU or all CPU), BLAS threads, and NCCL for multi-rank GPU runs. Throws
// dtrain::Error; MPI may already be running then, so a caller with peers should abort_all().
std::unique_ptr<Runtime> init(int* argc, char*** argv, const RuntimeOptions& options = {});

}  // namespace dtrain
