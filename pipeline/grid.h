// Note [Pipeline grid]: P x D ranks (world = P * D). World rank w = d * P + s is stage s of
// pipeline (replica) d: a pipeline's stages are consecutive ranks, so a launcher that fills
// nodes in rank order puts adjacent stages (which exchange activations every micro-batch) on one
// node where they fit; stage s's replicas {s, P + s, 2P + s, ...} (which all-reduce gradients once
// a step) span the nodes. Each rank gets two sub-communicators (Note [Sub-communicators] in
// comm/communicator.h): its pipeline's chain (rank = stage; point-to-point only) and its
// stage's data-parallel group (rank = d; gradient all-reduces).
//
// Note [Pipeline on a GPU]: MPI moves host memory only, so on a GPU each of the two groups gets
// a second communicator over the same ranks for device tensors: NCCL, bootstrapped over the MPI
// group (rank 0's unique id broadcast there, as PyTorch's new_group makes an NCCL communicator
// from its store when it does not split the parent; the chain's over a copy of the chain, since
// the chain itself runs point-to-point only), with the world NCCL communicator's deadline, watchdog and a flight recorder
// of its own (Runtime::device_communicator). Device tensors (activations and their gradients
// down the chain, the tied parameter's value and gradients, the gradient sums and the parameter
// broadcast over the stage's replicas) go over these; host values (the micro-batches' shapes,
// the losses and evaluation sums) stay on MPI. A rank issues both kinds in its schedule's order,
// the same as on CPU, and the replicas of a stage run the same schedule, so every rank issues
// its NCCL operations on the two communicators in the same order as its peers (NCCL's rule for
// communicators used side by side). On CPU there is no second communicator: tensor_chain() and
// tensor_group() are the MPI ones.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace dtrain {

struct PipelineGrid {
  int stages = 1, replicas = 1;
  int stage = 0, replica = 0;
  std::unique_ptr<Communicator> chain;          // this pipeline's stages
  std::unique_ptr<Communicator> data_parallel;  // this stage's replicas
  // Note [Pipeline on a GPU]: the same ranks for device tensors (NCCL), or null on CPU. Declared
  // last, so destroyed first, on every rank in the same order.
  std::unique_ptr<Communicator> device_chain, device_data_parallel;

  // Where device tensors go: the NCCL communicators on a GPU, else the MPI ones.
  Communicator& tensor_chain() const { return device_chain ? *device_chain : *chain; }
  Communicator& tensor_group() const { return device_data_parallel ? *device_data_parallel : *data_parallel; }
};

// Makes the device communicator over the ranks of a host group (collective over it; `name`
// names its flight recorder), or returns null where the host group carries tensors (CPU).
// Runtime::device_communicator is the trainers' one.
using DeviceGroupMaker = std::function<std::unique_ptr<Communicator>(Communicator& group, const std::string& name)>;

// "3 pipeline stages do not divide the 4 rank(s): ..." or "".
std::string pipeline_grid_problem(int world_size, int stages);

// Collective over `world`: throws (one line, pipeline_grid_problem) unless stages divides its size.
// With `device_group`, each group's device communicator too (Note [Pipeline on a GPU]).
PipelineGrid make_pipeline_grid(Communicator& world, int stages, const DeviceGroupMaker& device_group = {});

// At the run's end, on every rank: the grid's communicators, device ones first.
void shutdown_grid(PipelineGrid& grid);

}  // namespace dtrain
