// Helpers the pipeline tests under mpirun share (tests/mpi/pipeline_test.cpp, pipeline_gpt_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "pipeline/grid.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain::testing {

using Weights = std::map<std::string, std::vector<float>>;

// max |a - b| / max |b| over each tensor of `got` (by name), the worst of them.
inline double worst_relative(const Weights& got, const Weights& want) {
  double worst = 0;
  for (const auto& [name, values] : got) {
    const std::vector<float>& ref = want.at(name);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(values[i]) - ref[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
    }
    worst = std::max(worst, diff / std::max(scale, 1e-12));
  }
  return worst;
}

// Every stage count P >= 2 that divides the test world (the grids P x D it can form).
inline std::vector<int> pipeline_grids() {
  std::vector<int> out;
  for (int p = 2; p <= test_comm().size(); ++p)
    if (test_comm().size() % p == 0) out.push_back(p);
  return out;
}

// Runs `body(grid)` on every grid P x D with D > 1 (replicas to sum or shard over) that the test
// world forms, shutting each grid's communicators after it; the number of such grids (0: the
// caller skips). Collective over test_comm().
template <class Body>
int for_each_replicated_grid(Body body) {
  int grids = 0;
  for (int stages : pipeline_grids()) {
    PipelineGrid grid = make_pipeline_grid(test_comm(), stages);
    if (grid.replicas > 1) {
      ++grids;
      body(grid);
    }
    grid.chain->shutdown();
    grid.data_parallel->shutdown();
  }
  return grids;
}

}  // namespace dtrain::testing
