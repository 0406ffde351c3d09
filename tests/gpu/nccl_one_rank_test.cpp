// NCCL on one GPU through its plugin, the way the Runtime reaches it (Note [GPU plugins without
// a cycle] in core/gpu_backend.h): open_plugin checks the version, make_communicator builds a
// one-rank communicator over a SelfCommunicator, and its all-reduce is recorded in the flight
// recorder it was given and dumped where `dtrain flight-report` reads it (issue 20: NCCL's
// collectives were never recorded). Skips, saying why, without a GPU.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "app/flight_report.h"
#include "comm/flight_recorder.h"
#include "comm/gpu_plugins.h"
#include "comm/nccl/nccl_plugin.h"
#include "comm/nccl_options.h"
#include "comm/self_communicator.h"
#include "core/gpu_backend.h"
#include "tests/gpu/gpu_test.h"

namespace dtrain {
namespace {

using NcclOneRank = testing::GpuTest;

const NcclPlugin* nccl_plugin() {
  return static_cast<const NcclPlugin*>(
      open_plugin(gpu_plugin_path(kNcclPluginLibrary), kNcclPluginEntryPoint, kNcclPluginApiVersion));
}

// A one-minute timeout, the compute stream of `gpu`, and collectives recorded in `log`.
NcclOptions recorded_options(Device gpu, FlightRecorder& log) {
  NcclOptions options;
  options.timeout = std::chrono::seconds(60);
  options.compute = &compute_stream(gpu);
  options.log = &log;
  return options;
}

TEST_F(NcclOneRank, AllreduceThroughThePluginIsInTheFlightRecorderDump) {
  SelfCommunicator bootstrap;
  FlightRecorder log(16, "nccl");
  std::unique_ptr<Communicator> nccl(nccl_plugin()->make_communicator(bootstrap, gpu(), recorded_options(gpu(), log)));
  ASSERT_EQ(nccl->backend(), "nccl");

  const int n = 1000;
  Tensor t = Tensor::from_vector(std::vector<float>(n, 1.5f), {n}, gpu());
  {
    ScopedCollectiveDetail detail("bucket 0");
    allreduce_after(compute_stream(gpu()), *nccl, t.raw(), n, DType::kF32, ReduceOp::kSum)->wait();
  }
  EXPECT_EQ(t.to_vector(), std::vector<float>(n, 1.5f));  // one rank: the sum is the value
  // The watchdog thread marks it completed when its event completes: give it a moment.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (log.snapshot().at(0).state != CollectiveState::kCompleted && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));

  const std::string dir = ::testing::TempDir();
  std::string error;
  const std::string path = log.dump(dir, 0, 1, "test", {}, error);
  ASSERT_EQ(path, FlightRecorder::dump_path(dir, 0, "nccl")) << error;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json dump = nlohmann::json::parse(text.str());
  EXPECT_EQ(dump.at("communicator"), "nccl");
  ASSERT_EQ(dump.at("records").size(), 1u) << text.str();
  const nlohmann::json& r = dump.at("records")[0];
  EXPECT_EQ(r.at("seq"), 1);
  EXPECT_EQ(r.at("kind"), "allreduce");
  EXPECT_EQ(r.at("dtype"), "float32");
  EXPECT_EQ(r.at("count"), n);
  EXPECT_EQ(r.at("label"), "bucket 0");
  EXPECT_EQ(r.at("state"), "completed");
  const std::string report = flight_report({text.str()});
  EXPECT_NE(report.find("nccl collectives:"), std::string::npos) << report;
  std::printf("%s\n%s", text.str().c_str(), report.c_str());  // the dump and the report, for the record
}

// reduce_scatter and allgather through the plugin: on one rank each is a copy (none in place),
// recorded with its kind and count per rank, and device-timed like the all-reduce
// (Note [Device-timed collectives]) when the options ask for it.
TEST_F(NcclOneRank, ReduceScatterAndAllgatherAreRecordedAndDeviceTimed) {
  SelfCommunicator bootstrap;
  FlightRecorder log(16, "nccl");
  NcclOptions options = recorded_options(gpu(), log);
  options.device_timing = true;
  std::unique_ptr<Communicator> nccl(nccl_plugin()->make_communicator(bootstrap, gpu(), options));
  const int n = 777;
  std::vector<float> values(n);
  for (int i = 0; i < n; ++i) values[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i);
  Tensor send = Tensor::from_vector(values, {n}, gpu());
  Tensor recv = Tensor::zeros({n}, gpu());
  order_after(compute_stream(gpu()), *nccl);
  WorkHandle rs = nccl->reduce_scatter_async(send.raw(), recv.raw(), n, DType::kF32, ReduceOp::kAvg);
  rs->wait();
  EXPECT_EQ(recv.to_vector(), values);
  Tensor gathered = Tensor::zeros({n}, gpu());
  WorkHandle ag = nccl->allgather_async(recv.raw(), gathered.raw(), n, DType::kF32);
  ag->wait();
  WorkHandle in_place = nccl->reduce_scatter_async(gathered.raw(), gathered.raw(), n, DType::kF32, ReduceOp::kSum);
  in_place->wait();
  EXPECT_EQ(gathered.to_vector(), values);
  for (const WorkHandle& w : {rs, ag, in_place}) {
    ASSERT_TRUE(w->device_timed());
    w->wait_for_device_times();
    EXPECT_GT(w->started_ns(), 0);
    EXPECT_LE(w->started_ns(), w->finished_ns());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (log.snapshot().back().state != CollectiveState::kCompleted && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const std::vector<CollectiveRecord> records = log.snapshot();
  ASSERT_EQ(records.size(), 3u);
  const char* kinds[] = {"reduce_scatter", "allgather", "reduce_scatter"};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(records[i].kind, kinds[i]);
    EXPECT_EQ(records[i].count, n);
    EXPECT_EQ(records[i].state, CollectiveState::kCompleted) << kinds[i];
  }
}

// SIGUSR1 (request_flight_recorder_dump, what the handler does) reaches the real plugin's
// watchdog through the options the Runtime makes: it writes flight_recorder_rank0_nccl.json and
// the communicator goes on.
TEST_F(NcclOneRank, ADumpRequestWritesTheNcclRecorder) {
  const NcclPlugin* plugin = nccl_plugin();
  SelfCommunicator bootstrap;
  FlightRecorder log(16, "nccl");
  RuntimeOptions runtime;
  runtime.flight_recorder_dir = ::testing::TempDir();
  std::unique_ptr<Communicator> nccl(plugin->make_communicator(
      bootstrap, gpu(), runtime_nccl_options(runtime, &compute_stream(gpu()), &log, 0, 1)));
  Tensor t = Tensor::from_vector(std::vector<float>(8, 1.f), {8}, gpu());
  allreduce_after(compute_stream(gpu()), *nccl, t.raw(), 8, DType::kF32, ReduceOp::kSum)->wait();
  const std::string path = FlightRecorder::dump_path(runtime.flight_recorder_dir, 0, "nccl");
  std::remove(path.c_str());
  request_flight_recorder_dump();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!std::ifstream(path).good() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  ASSERT_FALSE(text.str().empty()) << "no " << path << " 10 s after the request";
  EXPECT_NE(text.str().find("SIGUSR1"), std::string::npos) << text.str();
  allreduce_after(compute_stream(gpu()), *nccl, t.raw(), 8, DType::kF32, ReduceOp::kSum)->wait();
  EXPECT_EQ(t.to_vector(), std::vector<float>(8, 1.f));
}

// Note [Point-to-point]: ncclSend/ncclRecv to itself in one group (one rank), recorded as a
// "sendrecv" in the flight recorder.
TEST_F(NcclOneRank, APointToPointBatchToItselfCopiesAndIsRecorded) {
  SelfCommunicator bootstrap;
  FlightRecorder log(16, "nccl");
  std::unique_ptr<Communicator> nccl(nccl_plugin()->make_communicator(bootstrap, gpu(), recorded_options(gpu(), log)));
  const int n = 1000;
  Tensor from = Tensor::from_vector(std::vector<float>(n, 2.5f), {n}, gpu());
  Tensor to = Tensor::zeros({n}, gpu());
  order_after(compute_stream(gpu()), *nccl);
  nccl->batch_p2p_async({{P2pOp::kSend, from.raw(), n, DType::kF32, 0, 0}, {P2pOp::kRecv, to.raw(), n, DType::kF32, 0, 0}})
      ->wait();
  EXPECT_EQ(to.to_vector(), std::vector<float>(n, 2.5f));
  ASSERT_FALSE(log.snapshot().empty());
  EXPECT_EQ(log.snapshot().back().kind, "sendrecv");
  EXPECT_EQ(log.snapshot().back().count, 2 * n);
}

}  // namespace
}  // namespace dtrain
