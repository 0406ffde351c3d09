// dtrain::init() and the Runtime it returns (see runtime.h).
#include "comm/runtime.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "comm/exchange.h"
#include "comm/flight_recorder.h"
#include "comm/gpu_plugins.h"
#include "comm/local_topology.h"
#include "comm/mpi_communicator.h"
#include "comm/mpi_lifecycle.h"
#include "comm/nccl_options.h"
#include "comm/self_communicator.h"
#include "comm/world_communicator.h"
#include "comm/nccl/nccl_plugin.h"
#include "core/error.h"
#include "core/gpu_backend.h"
#include "core/ops.h"

namespace dtrain {

namespace {

// NCCL cannot run two ranks of one communicator on one GPU (it fails or hangs at init). Ranks
// compare "host/PCI bus id", so a shared GPU is one clear error on every rank; ranks that each
// see one GPU through their own CUDA_VISIBLE_DEVICES pass (Note [Per-task visible GPUs]).
void check_one_rank_per_gpu(Device device, Communicator& control) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string mine = fmt::format("{}/{}", host, gpu_backend().pci_bus_id(device.index));
  if (std::string error = shared_gpu_error(allgather_strings(control, mine), control.rank()); !error.empty())
    throw Error(error);
}

// The NCCL communicator lives in its plugin (Note [GPU plugins without a cycle] in
// core/gpu_backend.h), opened here, by the layer that uses it.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, Device device, const NcclOptions& options) {
  const auto* plugin = static_cast<const NcclPlugin*>(
      open_plugin(gpu_plugin_path(kNcclPluginLibrary), kNcclPluginEntryPoint, kNcclPluginApiVersion));
  return std::unique_ptr<Communicator>(plugin->make_communicator(bootstrap, device, options));
}

}  // namespace

NcclOptions runtime_nccl_options(const RuntimeOptions& options, Stream* compute, FlightRecorder* log, int rank,
                                 int size) {
  NcclOptions nccl;
  // No deadline (0) is a deadline no collective reaches.
  const double timeout_s = options.collective_timeout_s > 0 ? options.collective_timeout_s : 1e9;
  nccl.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  nccl.compute = compute;
  nccl.device_timing = options.device_timing;
  if (!log) return nccl;
  nccl.log = log;
  nccl.dump_log = [log, dir = options.flight_recorder_dir, rank, size](const std::string& reason) {
    std::string error;
    const std::string path = log->dump(dir, rank, size, reason, {}, error);
    return path.empty() ? "not written: " + error : path;
  };
  // The plugin does not link comm: SIGUSR1's count reaches its watchdog through this pointer.
  nccl.dump_requests = &flight_recorder_dump_requests;
  return nccl;
}

std::unique_ptr<Runtime> init(int* argc, char*** argv, const RuntimeOptions& options) {
  install_gpu_backend_loader();  // core opens no plugin itself (Note [GPU plugins without a cycle])
  std::unique_ptr<Runtime> rt(new Runtime);
  rt->options_ = options;
  rt->topology_ = probe_cpu_topology();
  if (started_by_launcher(process_env)) {
    rt->owns_mpi_ = start_mpi(argc, argv, comm_thread_should_yield(rt->topology_), options.concurrent_communicators);
    const AllreduceChoice choice = choose_allreduce(options.allreduce, world_node_layout());
    rt->allreduce_note_ = choice.reason;
    rt->control_ = make_world_communicator(
        choice.algorithm, CollectiveOptions{options.collective_timeout_s, options.flight_recorder_size,
                                            options.flight_recorder_dir, options.debug_collectives, true, "mpi"});
    if (std::string problem = launcher_world_mismatch(process_env, rt->control_->size()); !problem.empty())
      throw Error(problem);
    set_world_rank_for_messages(rt->control_->rank());
    check_local_topology(rt->control_->local_rank(), rt->control_->local_size(), process_env);
  } else {
    rt->control_ = std::make_unique<SelfCommunicator>();
  }
  rt->choose_device(options);
  rt->cpu_threads_ = set_cpu_threads(blas_threads_for_rank(options.cpu_threads, rt->topology_, rt->local_size()));
  rt->start_gradient_communicator(options);
  return rt;
}

void Runtime::choose_device(const RuntimeOptions& options) {
  const DeviceChoice choice = select_device(options.device, local_rank(), local_size(), options.allow_gpu_sharing);
  device_ = choice.device;
  device_note_ = choice.log_line;
  // Every rank must take the same path (NCCL or MPI for gradients): with an automatic choice on
  // a job whose nodes differ, the ranks would otherwise issue different collectives and hang.
  int32_t cuda_ranks = device_.is_cuda() ? 1 : 0;
  control_->allreduce(&cuda_ranks, 1, DType::kI32, ReduceOp::kSum);
  if (cuda_ranks != 0 && cuda_ranks != size())
    throw Error(fmt::format("device {}: {} of {} ranks found a GPU and the others did not; request cpu or cuda "
                            "explicitly",
                            options.device.str(), cuda_ranks, size()));
  if (device_.is_cuda()) set_allow_tf32(options.tf32);
}

void Runtime::start_gradient_communicator(const RuntimeOptions& options) {
  // Gradients move over NCCL on GPU (device buffers, communication stream) and over the control
  // communicator on CPU; one process needs no gradient communicator at all.
  if (!device_.is_cuda() || size() == 1) return;
  check_one_rank_per_gpu(device_, *control_);
  // NCCL's collectives in a recorder of their own (their own sequence numbers), dumped to
  // flight_recorder_rank<R>_nccl.json when the NCCL watchdog fails the run or on SIGUSR1.
  if (options.flight_recorder_size > 0)
    gradients_log_ = std::make_unique<FlightRecorder>(options.flight_recorder_size, "nccl");
  gradients_ = make_nccl_communicator(
      *control_, device_, runtime_nccl_options(options, &compute_stream(), gradients_log_.get(), rank(), size()));
}

std::unique_ptr<Communicator> Runtime::device_communicator(Communicator& group, const std::string& name) {
  if (!device_.is_cuda()) return nullptr;
  FlightRecorder* log = nullptr;
  if (options_.flight_recorder_size > 0)
    log = device_logs_.emplace_back(std::make_unique<FlightRecorder>(options_.flight_recorder_size, name)).get();
  // The dump is named by the world rank, as every other recorder of this process.
  return make_nccl_communicator(group, device_,
                                runtime_nccl_options(options_, &compute_stream(), log, rank(), size()));
}

Runtime::~Runtime() {
  try {
    gradients_.reset();
    control_->shutdown();
    control_.reset();
    if (owns_mpi_) finish_mpi();
  } catch (const std::exception& e) {
    // A destructor must not throw; a failed shut-down is worth a line, not a crash.
    std::fprintf(stderr, "dtrain: shutting down: %s\n", e.what());
  }
}

}  // namespace dtrain
