#include "ddp/trainer.h"

#include <chrono>
#include <cstring>
#include <cstdlib>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "comm/mpi_communicator.h"
#include "core/cpu_blas.h"
#include "core/device_select.h"
#include "core/error.h"
#include "core/ops.h"
#include "data/data_loader.h"
#include "data/distributed_sampler.h"
#include "data/mnist.h"
#include "ddp/batch_stager.h"
#include "ddp/distributed_data_parallel.h"
#include "model/fingerprint.h"
#include "model/loss.h"
#include "model/optimizer.h"
#ifdef DTRAIN_WITH_CUDA
#include <unistd.h>

#include "comm/nccl/nccl_communicator.h"
#include "core/cuda/cuda_backend.h"
#endif

namespace dtrain {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& c, std::vector<Parameter*> params) {
  if (c.optimizer == "sgd")
    return std::make_unique<Sgd>(std::move(params), SgdOptions{c.lr, c.momentum, 0.f, c.weight_decay, c.nesterov});
  if (c.optimizer == "adamw") {
    AdamWOptions o;
    o.lr = c.lr;
    o.weight_decay = c.weight_decay;
    return std::make_unique<AdamW>(std::move(params), o);
  }
  throw UsageError(fmt::format("--optimizer: expected sgd or adamw, got '{}'", c.optimizer));
}

// Fetches the next host batch and starts its move to the device; false at the end of the epoch.
// On CUDA the trainer calls it right after taking the current batch, so the copy overlaps the
// current step. On CPU the staged tensors are the loader's own buffer, which next() recycles,
// so there it is called only after the step (!stager.copies()).
bool fetch_and_stage(DataLoader& loader, Batch& batch, BatchStager& stager) {
  if (!loader.next(batch)) return false;
  stager.stage(batch);
  return true;
}

// Loss and accuracy on this rank's shard of the test set (i = rank, rank + size, ...: no
// padding, so every sample counts once), summed over ranks.
std::pair<double, double> evaluate(Module& model, const Dataset& test, Communicator& comm, Device device) {
  std::vector<int64_t> shard;
  for (int64_t i = comm.rank(); i < test.size(); i += comm.size()) shard.push_back(i);
  DataLoader loader(test, 1000);
  loader.start_epoch(std::move(shard));
  model.set_training(false);
  CrossEntropyLoss loss_fn(Reduction::kSum);
  Batch batch;
  BatchStager stager(device);
  const bool prefetch = stager.copies();
  double totals[3] = {0, 0, 0};  // loss sum, correct, count
  for (bool more = fetch_and_stage(loader, batch, stager); more;) {
    Tensor images, labels;
    stager.take(images, labels);
    if (prefetch) more = fetch_and_stage(loader, batch, stager);
    Tensor logits = model.forward(images);
    totals[0] += loss_value(loss_fn.forward(logits, labels));
    totals[1] += static_cast<double>(count_correct(logits, labels));
    totals[2] += static_cast<double>(labels.numel());
    if (!prefetch) more = fetch_and_stage(loader, batch, stager);
  }
  model.set_training(true);
  float sums[3] = {static_cast<float>(totals[0]), static_cast<float>(totals[1]), static_cast<float>(totals[2])};
  comm.allreduce(sums, 3, DType::kF32, ReduceOp::kSum);
  return {sums[0] / std::max(sums[2], 1.f), sums[1] / std::max(sums[2], 1.f)};
}

#ifdef DTRAIN_WITH_CUDA
// NCCL cannot run two ranks of one communicator on one GPU (it fails or hangs at init). Ranks
// compare "host/PCI bus id" over MPI, so a shared GPU is one clear error on every rank; ranks
// that each see one GPU through their own CUDA_VISIBLE_DEVICES pass.
void check_one_rank_per_gpu(Device device, Communicator& comm) {
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  const std::string mine = fmt::format("{}/{}", host, cuda::pci_bus_id(device.index));
  constexpr int64_t kWords = 32;  // 128 bytes per rank
  std::vector<int32_t> send(kWords, 0), all(static_cast<size_t>(kWords * comm.size()));
  std::memcpy(send.data(), mine.data(), std::min<size_t>(mine.size(), kWords * 4 - 1));
  comm.allgather(send.data(), all.data(), kWords, DType::kI32);
  for (int r = 0; r < comm.size(); ++r) {
    const std::string other(reinterpret_cast<const char*>(all.data() + r * kWords));
    if (r != comm.rank() && other == mine)
      throw Error(fmt::format("ranks {} and {} share GPU {}; NCCL needs one GPU per rank (run at most as many ranks "
                              "per node as GPUs)",
                              std::min(r, comm.rank()), std::max(r, comm.rank()), mine));
  }
}
#endif

int default_cpu_threads(const Communicator& comm) {
  if (std::getenv("OPENBLAS_NUM_THREADS")) return 0;  // the launcher or the user decided
  // The node's cores shared among its ranks, but never more than this rank is bound to: plain
  // mpirun binds each of 2 ranks to one core, where more threads would only take turns.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, std::min(cpus_this_process_may_use(), cores / std::max(1, comm.local_size())));
}

}  // namespace

TrainResult train(const TrainConfig& c, Communicator& comm) {
  const bool log = comm.rank() == 0 && !c.quiet;
  const DeviceChoice choice = select_device(c.device, comm.local_rank(), comm.local_size(), c.allow_gpu_sharing);
  const Device device = choice.device;
  // Every rank must take the same path (NCCL or MPI for gradients): with --device auto on a
  // job whose nodes differ, the ranks would otherwise issue different collectives and hang.
  int32_t cuda_ranks = device.is_cuda() ? 1 : 0;
  comm.allreduce(&cuda_ranks, 1, DType::kI32, ReduceOp::kSum);
  if (cuda_ranks != 0 && cuda_ranks != comm.size())
    throw Error(fmt::format("--device {}: {} of {} ranks found a GPU and the others did not; pass --device cpu or "
                            "--device cuda explicitly",
                            c.device, cuda_ranks, comm.size()));
  if (device.is_cuda()) set_allow_tf32(c.tf32);
  const int threads = set_cpu_threads(c.threads > 0 ? c.threads : default_cpu_threads(comm));

  const Normalize norm{c.norm_mean, c.norm_std};
  auto train_set = MnistDataset::load(c.data_dir, Split::kTrain, norm, c.train_limit);
  auto test_set = MnistDataset::load(c.data_dir, Split::kTest, norm, c.test_limit);
  // Logged once the data has loaded, so a run that fails on its input prints only the error.
  if (!choice.log_line.empty() && comm.local_rank() == 0 && !c.quiet)
    fmt::print("rank {}: {}\n", comm.rank(), choice.log_line);

  auto model = build_model(c.model, train_set->sample_shape(), train_set->num_classes(), device, c.seed);
  model->set_amp(c.amp);
  Tracer tracer(!c.trace_path.empty());
  DdpOptions ddp_options;
  ddp_options.bucket_cap_bytes = static_cast<size_t>(c.bucket_cap_mb * 1024 * 1024);
  ddp_options.find_unused_parameters = c.find_unused_parameters;
  ddp_options.comm_hook = c.comm_hook;
  // Gradients move over NCCL on GPU (device buffers, communication stream) and over MPI on
  // CPU; the MPI communicator keeps host-side control (model check, metrics, trace).
  std::unique_ptr<Communicator> nccl;
#ifdef DTRAIN_WITH_CUDA
  if (device.is_cuda() && comm.size() > 1) {
    check_one_rank_per_gpu(device, comm);
    NcclOptions nccl_options;
    nccl_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.timeout_s * 1000));
    nccl = std::make_unique<NcclCommunicator>(comm, device, nccl_options);
  }
#endif
  Communicator& grad_comm = nccl ? *nccl : comm;
  // One process needs no gradient sync; DDP would only add a comm-thread round trip per step.
  std::optional<DistributedDataParallel> ddp;
  if (comm.size() > 1) ddp.emplace(*model, grad_comm, ddp_options, &tracer, nullptr, &comm);
  auto optimizer = make_optimizer(c, model->parameters());
  const LrSchedule schedule{c.lr_schedule, c.lr, c.lr_step_size, c.lr_gamma, c.epochs, 0.f};

  std::string grad_path = comm.size() == 1 ? "no gradient sync (1 rank)" : "gradients over " + grad_comm.backend();
  if (const auto* mpi = dynamic_cast<const MpiCommunicator*>(&grad_comm); mpi && mpi->shared_memory_allreduce())
    grad_path += " (shared-memory all-reduce)";
  if (log)
    fmt::print("dtrain: {} on {} rank(s), device {}, {}, {} BLAS thread(s)/rank ({} kernels), batch {}/rank, "
               "{} train / {} test samples\n",
               model->describe(), comm.size(), device.str(), grad_path, threads, blas_corename(), c.batch_size,
               train_set->size(), test_set->size());
  if (log && c.amp == AmpMode::kBf16)
    fmt::print("dtrain: amp bf16: Linear matmuls take bf16 operands with float32 accumulation; float32 master "
               "weights and gradients{}\n",
               device.is_cpu() ? " (emulated on CPU: bf16-rounded operands through the float32 GEMM, for the "
                                 "numerics, not for speed)"
                               : "");

  DistributedSampler sampler(train_set->size(), comm.size(), comm.rank(), true, c.seed);
  DataLoader loader(*train_set, c.batch_size);
  CrossEntropyLoss loss_fn;
  Batch batch;
  BatchStager stager(device);
  const bool prefetch = stager.copies();  // see fetch_and_stage
  TrainResult result;
  result.world_size = comm.size();
  result.device = device.str();

  for (int64_t epoch = 0; epoch < c.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    loader.start_epoch(sampler.indices());
    optimizer->set_lr(schedule.lr_at(epoch));
    const int64_t batches = loader.num_batches();
    int64_t epoch_samples = 0;
    const auto t0 = std::chrono::steady_clock::now();
    bool more = fetch_and_stage(loader, batch, stager);
    for (int64_t b = 0; more; ++b) {
      Tensor images, labels;
      stager.take(images, labels);
      const int64_t batch_samples = labels.numel();
      if (prefetch) more = fetch_and_stage(loader, batch, stager);  // batch b+1's copy overlaps step b
      const int64_t micro = b % c.accumulate;
      const bool step_now = micro == c.accumulate - 1 || b == batches - 1;
      if (micro == 0) optimizer->zero_grad();
      Tensor logits = ddp ? ddp->forward(images) : model->forward(images);
      Tensor loss = loss_fn.forward(logits, labels);
      Tensor grad = loss_fn.backward();
      // The step sees the mean over its micro-batches (the epoch's last group may be shorter).
      const int64_t group = std::min(c.accumulate, batches - (b - micro));
      if (group > 1) scale(grad, 1.f / static_cast<float>(group));
      if (!ddp) {
        ScopedSpan span(&tracer, "backward");
        model->backward(grad, false);
      } else if (step_now) {
        ddp->backward(grad);
      } else {
        auto guard = ddp->no_sync();
        ddp->backward(grad);
      }
      if (step_now) {
        ScopedSpan span(&tracer, "optimizer step");
        optimizer->step();
      }
      epoch_samples += batch_samples;
      if (log && b % c.log_interval == 0)
        fmt::print("Train Epoch: {} [{}/{} ({:.0f}%)] Loss: {:.6f}\n", epoch + 1, b * c.batch_size * comm.size(),
                   train_set->size(), 100.0 * static_cast<double>(b) / static_cast<double>(batches),
                   loss_value(loss));
      if (!prefetch) more = fetch_and_stage(loader, batch, stager);
    }
    if (device.is_cuda()) compute_stream(device).synchronize();
    const double seconds = seconds_since(t0);
    const int64_t global_samples = epoch_samples * comm.size();  // every rank runs the same count
    result.train_samples += global_samples;
    result.train_seconds += seconds;

    auto [test_loss, test_acc] = evaluate(*model, *test_set, comm, device);
    result.test_loss = test_loss;
    result.test_accuracy = test_acc;
    if (log) {
      fmt::print("Test set: Average loss: {:.4f}, Accuracy: {:.0f}/{} ({:.2f}%)\n", test_loss,
                 test_acc * static_cast<double>(test_set->size()), test_set->size(), 100.0 * test_acc);
      fmt::print("Epoch {}: {:.1f} samples/s ({} samples in {:.2f} s on {} rank(s))\n", epoch + 1,
                 static_cast<double>(global_samples) / seconds, global_samples, seconds, comm.size());
    }
  }
  result.samples_per_second = result.train_seconds > 0 ? static_cast<double>(result.train_samples) / result.train_seconds : 0;
  result.parameters_fingerprint = parameters_fingerprint(*model);

  if (tracer.enabled()) {
    Tracer::Overlap o = tracer.write(c.trace_path, comm);
    result.allreduce_overlap = o.allreduce_ns > 0 ? o.overlapped_ns / o.allreduce_ns : 0.0;
    if (log)
      fmt::print("trace: wrote {} ({} spans on rank 0); all-reduce time overlapping backward: {:.1f}% of {:.1f} ms\n",
                 c.trace_path, tracer.spans().size(), 100.0 * result.allreduce_overlap, o.allreduce_ns / 1e6);
  }
  return result;
}

}  // namespace dtrain
