// Training across the test bed with the hierarchical all-reduce against the flat one: the same
// run (seed, data, ranks) twice, once per algorithm, each with a Runtime of its own. Losses
// logged at every step agree within 1e-6 relative (only the order of the float32 sums differs),
// and in each run every rank ends with bitwise the same parameters. Runs at 2x1 and 2x2 on the
// bed (tests/multinode/CMakeLists.txt); on one node (np 2, 3) hierarchical is one node's shm.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/trainer.h"
#include "comm/exchange.h"
#include "tests/mpi/mpi_test_env.h"

namespace dtrain {
namespace {

std::vector<double> logged_losses(const std::string& path) {
  std::vector<double> losses;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record["type"] == "step") losses.push_back(record["loss"].get<double>());
  }
  return losses;
}

// One run with `algorithm`; returns rank 0's metrics file. EXPECTs every rank's parameters equal.
std::string train_with(AllreduceAlgorithm algorithm, const std::string& dir) {
  RuntimeOptions options;
  options.device = DeviceRequest::cpu();
  options.cpu_threads = 1;
  options.allreduce = algorithm;
  int argc = 0;
  char** argv = nullptr;
  std::unique_ptr<Runtime> runtime = init(&argc, &argv, options);  // MPI is running: no second MPI_Init
  TrainConfig c;
  c.data.dir = DTRAIN_FMNIST_DIR;
  c.data.train_limit = 2048;
  c.data.test_limit = 256;
  c.batch_size = 32;
  c.seed = 5;
  c.runtime = options;
  c.output.quiet = true;
  c.output.log_interval = 1;
  c.output.metrics_path = dir + "/" + allreduce_algorithm_name(algorithm) + ".jsonl";
  const TrainResult r = train(*runtime, c);
  const std::vector<uint64_t> fingerprints = allgather_values(runtime->control(), r.parameters_fingerprint);
  for (size_t rank = 1; rank < fingerprints.size(); ++rank)
    EXPECT_EQ(fingerprints[rank], fingerprints[0])
        << allreduce_algorithm_name(algorithm) << ": rank " << rank << "'s parameters differ from rank 0's";
  EXPECT_NE(runtime->allreduce_note().find(allreduce_algorithm_name(algorithm)), std::string::npos)
      << runtime->allreduce_note();
  return c.output.metrics_path;
}

TEST(TrainAcrossNodes, HierarchicalLossesMatchFlatAndRanksAgree) {
  if (!std::filesystem::exists(std::string(DTRAIN_FMNIST_DIR) + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST not installed at " << DTRAIN_FMNIST_DIR;
  Communicator& comm = testing::test_comm();
  std::string dir = comm.rank() == 0 ? std::filesystem::temp_directory_path() / "dtrain-train-allreduce-XXXXXX" : "";
  if (comm.rank() == 0) {
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
  }
  const std::string flat = train_with(AllreduceAlgorithm::kFlat, dir);
  const std::string hier = train_with(AllreduceAlgorithm::kHierarchical, dir);
  if (comm.rank() != 0) return;
  const std::vector<double> a = logged_losses(flat), b = logged_losses(hier);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 10u);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double rel = std::abs(a[i] - b[i]) / std::max(std::abs(a[i]), 1e-30);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-6) << "step " << i << ": flat loss " << a[i] << ", hierarchical " << b[i];
  }
  std::printf("%zu logged steps; largest relative loss difference hierarchical vs flat: %.3g\n", a.size(), worst);
}

}  // namespace
}  // namespace dtrain
