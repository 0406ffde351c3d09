// Note [Pipeline grid]: P x D ranks (world = P * D). World rank w = d * P + s is stage s of
// pipeline (replica) d: a pipeline's stages are consecutive ranks, so a launcher that fills
// nodes in rank order puts adjacent stages (which exchange activations every micro-batch) on one
// node where they fit; stage s's replicas {s, P + s, 2P + s, ...} (which all-reduce gradients once
// a step) span the nodes. Each rank gets two sub-communicators (Note [Sub-communicators] in
// comm/communicator.h): its pipeline's chain (rank = stage; point-to-point only) and its
// stage's data-parallel group (rank = d; gradient all-reduces).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace dtrain {

struct PipelineGrid {
  int stages = 1, replicas = 1;
  int stage = 0, replica = 0;
  std::unique_ptr<Communicator> chain;          // this pipeline's stages
  std::unique_ptr<Communicator> data_parallel;  // this stage's replicas
};

// "3 pipeline stages do not divide the 4 rank(s): ..." or "".
std::string pipeline_grid_problem(int world_size, int stages);

// Collective over `world`: throws (one line, pipeline_grid_problem) unless stages divides its size.
PipelineGrid make_pipeline_grid(Communicator& world, int stages);

}  // namespace dtrain
