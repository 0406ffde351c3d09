// `dtrain bench allreduce`: for each path and dtype, every size is reset from the inputs,
// all-reduced once per call after a barrier, timed, and checked against the exact sums.
#include "app/bench_allreduce.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "app/bench_report.h"
#include "comm/exchange.h"
#include "comm/world_communicator.h"
#include "core/error.h"
#include "core/temp_files.h"

namespace dtrain {

namespace {

struct PathPlan {
  BenchPath path;
  std::string skip_reason;  // empty: it runs
};

std::string skip_reason(BenchPath path, bool asked, const NodeLayout& layout, Runtime& rt) {
  switch (path) {
    case BenchPath::kFlat: return "";
    case BenchPath::kShm:
      return layout.nodes > 1 ? fmt::format("the job spans {} nodes; shared memory reaches one node", layout.nodes) : "";
    case BenchPath::kHierarchical:
      if (asked) return "";
      if (layout.nodes == 1) return "one node: it is the shm path plus a broadcast (--paths hierarchical runs it)";
      if (layout.max_local_size == 1) return "one rank per node: it is the flat path (--paths hierarchical runs it)";
      return "";
    case BenchPath::kNccl:
      if (!rt.device().is_cuda()) return fmt::format("needs a CUDA device on every rank ({})", rt.device_note());
      if (rt.gradients().backend() != "nccl")
        return fmt::format("the gradient communicator is {}, not NCCL", rt.gradients().backend());
      return "";
  }
  return "unknown path";
}

std::vector<PathPlan> plan_paths(const BenchAllreduceConfig& c, const NodeLayout& layout, Runtime& rt) {
  const bool asked = !c.paths.empty();
  const std::vector<BenchPath> paths =
      asked ? c.paths
            : std::vector<BenchPath>{BenchPath::kFlat, BenchPath::kShm, BenchPath::kHierarchical, BenchPath::kNccl};
  std::vector<PathPlan> plans;
  for (BenchPath p : paths) plans.push_back({p, skip_reason(p, asked, layout, rt)});
  return plans;
}

// The inputs of this rank and the exact sums, for the largest size (smaller sizes use a prefix).
struct Inputs {
  std::vector<uint8_t> input, expected;
};

Inputs make_inputs(DType dtype, int64_t count, int rank, int ranks) {
  return {encode_values(dtype, count, [&](int64_t i) { return bench_input(rank, i); }),
          encode_values(dtype, count, [&](int64_t i) { return bench_expected_sum(ranks, i); })};
}

struct Target {
  std::string path;
  Communicator& comm;
  Tensor buffer;  // the largest size, where the path reduces (device memory for NCCL)
};

// The test hook: one element of the result, changed on `rank` only.
void corrupt(void* result, DType dtype, int64_t count) {
  auto* p = static_cast<uint8_t*>(result) + (count / 2) * static_cast<int64_t>(dtype_size(dtype));
  p[dtype_size(dtype) - 1] ^= 0x40;  // an exponent bit: a value far from the sum
}

BenchRow measure(Runtime& rt, Target& t, const Inputs& in, DType dtype, int64_t bytes, const BenchAllreduceConfig& c) {
  const int64_t count = bytes / static_cast<int64_t>(dtype_size(dtype));
  Tensor dst = Tensor::from_external(t.buffer.raw(), {count}, t.buffer.device(), dtype);
  const Tensor src = Tensor::from_external(const_cast<uint8_t*>(in.input.data()), {count}, Device::cpu(), dtype);
  Tensor host = dst.device().is_cpu() ? dst : Tensor::empty({count}, Device::cpu(), dtype);
  Communicator& control = rt.control();
  std::vector<double> times;
  int64_t wrong = 0;
  for (int it = 0; it < c.warmup + c.iters; ++it) {
    dst.copy_from(src);
    if (!dst.device().is_cpu()) rt.compute_stream().synchronize();
    control.barrier();
    const int64_t t0 = steady_now_ns();
    t.comm.allreduce_async(dst.raw(), count, dtype, ReduceOp::kSum)->wait();
    t.comm.stream().synchronize();
    const int64_t t1 = steady_now_ns();
    if (it >= c.warmup) times.push_back(static_cast<double>(t1 - t0) * 1e-9);
    if (!dst.device().is_cpu()) host.copy_from(dst);
    if (control.rank() == c.corrupt_rank) corrupt(host.raw(), dtype, count);
    int64_t first = 0;
    const int64_t bad = count_wrong(host.raw(), in.expected.data(), count, dtype, &first);
    if (bad > 0 && wrong == 0)
      fmt::print(stderr, "dtrain bench: rank {}: WRONG RESULT: {} {} {} B call {}: {} of {} elements differ from the "
                 "exact sum (element {}: got {}, expected {})\n", control.rank(), t.path, dtype_name(dtype), bytes, it,
                 bad, count, first, decode_value(host.raw(), dtype, first), decode_value(in.expected.data(), dtype, first));
    wrong += bad;
  }
  BenchRow row{t.path, dtype, bytes, count};
  for (double s : allgather_values(control, median_of(times))) row.seconds = std::max(row.seconds, s);
  for (int64_t w : allgather_values(control, wrong)) row.wrong += w;
  row.algbw = static_cast<double>(bytes) / row.seconds / 1e9;
  row.busbw = bus_bandwidth(row.algbw, control.size());
  return row;
}

void sweep(Runtime& rt, const std::string& path, Communicator& comm, Device device, const BenchAllreduceConfig& c,
           std::vector<BenchRow>& rows) {
  for (DType dtype : c.dtypes) {
    const auto esize = static_cast<int64_t>(dtype_size(dtype));
    const int64_t max_count = c.max_bytes / esize;
    if (max_count == 0) continue;
    const Inputs in = make_inputs(dtype, max_count, rt.rank(), rt.size());
    Target target{path, comm, comm.allocate_reduce_buffer(max_count, dtype, device)};
    for (int64_t bytes : bench_sizes(c.min_bytes, c.max_bytes))
      if (bytes % esize == 0) rows.push_back(measure(rt, target, in, dtype, bytes, c));
  }
}

void write_json(const std::string& path, const nlohmann::json& j) {
  remove_stale_temporaries(path);
  const std::string tmp = temporary_path(path);
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out.flush()) throw Error(fmt::format("cannot write the benchmark results to '{}'", path));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);  // complete or absent, never half-written
  if (ec) throw Error(fmt::format("cannot write the benchmark results to '{}': {}", path, ec.message()));
}

}  // namespace

int64_t run_bench_allreduce(Runtime& rt, const BenchAllreduceConfig& c) {
  if (rt.size() < 2)
    throw Error("bench allreduce needs at least 2 ranks (start it with dtrain-launch -n 2 or mpirun -np 2)");
  const NodeLayout layout = world_node_layout();
  BenchHeader header{rt.size(), layout.nodes, layout.max_local_size, rt.device().str(), c.iters, c.warmup};
  std::vector<BenchRow> rows;
  std::vector<BenchSkip> skipped;
  for (const PathPlan& plan : plan_paths(c, layout, rt)) {
    const std::string name = bench_path_name(plan.path);
    if (!plan.skip_reason.empty()) {
      skipped.push_back({name, plan.skip_reason});
      continue;
    }
    if (plan.path == BenchPath::kNccl) {
      sweep(rt, name, rt.gradients(), rt.device(), c, rows);
      continue;
    }
    const AllreduceAlgorithm algorithm = plan.path == BenchPath::kFlat  ? AllreduceAlgorithm::kFlat
                                         : plan.path == BenchPath::kShm ? AllreduceAlgorithm::kShm
                                                                        : AllreduceAlgorithm::kHierarchical;
    std::unique_ptr<Communicator> comm = make_world_communicator(algorithm);
    if (plan.path == BenchPath::kShm && comm->describe().find("shared-memory") == std::string::npos) {
      skipped.push_back({name, "the node-shared window could not be made here (or DTRAIN_SHM_ALLREDUCE=0)"});
    } else {
      sweep(rt, name, *comm, Device::cpu(), c, rows);
    }
    comm->shutdown();
  }
  if (rt.rank() == 0) {
    fmt::print("{}", format_bench_report(header, rows, skipped));
    std::fflush(stdout);
    if (!c.json_path.empty()) write_json(c.json_path, bench_json(header, rows, skipped));
  }
  int64_t wrong = 0;
  for (const BenchRow& r : rows) wrong += r.wrong;
  return wrong;
}

}  // namespace dtrain
