// `dtrain bench allreduce` flags into a BenchAllreduceConfig, each checked once.
#include <fmt/format.h>

#include "app/bench_allreduce.h"
#include "core/command_line.h"
#include "core/error.h"

namespace dtrain {

namespace {

constexpr int64_t kMaxBenchBytes = int64_t{4} << 30;  // three buffers of this per rank

int64_t parse_bytes(const std::string& flag, const std::string& text) {
  return dtrain::parse_bytes(flag, text, kMaxBenchBytes, "4G");
}

template <class T, class Parse>
std::vector<T> parse_list(const std::string& flag, const std::string& text, Parse parse, const char* expected) {
  std::vector<T> out;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(',', start);
    const std::string item = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::optional<T> v = parse(item);
    if (!v) throw UsageError(fmt::format("{}: expected a comma-separated list of {}, got '{}'", flag, expected, text));
    if (std::find(out.begin(), out.end(), *v) == out.end()) out.push_back(*v);
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

std::optional<BenchPath> parse_path(const std::string& name) {
  for (BenchPath p : {BenchPath::kFlat, BenchPath::kShm, BenchPath::kHierarchical, BenchPath::kNccl})
    if (name == bench_path_name(p)) return p;
  return std::nullopt;
}

std::optional<DType> parse_dtype(const std::string& name) {
  if (name == "float32" || name == "f32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  return std::nullopt;
}

cxxopts::Options make_options() {
  cxxopts::Options o("dtrain bench allreduce",
                     "All-reduce time, algorithm and bus bandwidth by size for each path (nccl-tests' method); every "
                     "result is checked against the exact sum. Run it on 2 or more ranks: dtrain-launch -n 2 -- dtrain "
                     "bench allreduce");
  // clang-format off
  o.add_options()
    ("min-bytes", "Smallest message (K, M, G suffixes)", cxxopts::value<std::string>()->default_value("8"))
    ("max-bytes", "Largest message; sizes double from --min-bytes", cxxopts::value<std::string>()->default_value("256M"))
    ("iters", "Timed calls per size (the median is reported)", cxxopts::value<int>()->default_value("20"))
    ("warmup", "Untimed calls per size before the timed ones", cxxopts::value<int>()->default_value("5"))
    ("paths", "all, or a list of flat, shm, hierarchical, nccl (all: those this job can run)", cxxopts::value<std::string>()->default_value("all"))
    ("dtypes", "float32, bf16 or both (comma separated)", cxxopts::value<std::string>()->default_value("float32,bf16"))
    ("device", "auto, cpu or cuda (the NCCL path needs CUDA)", cxxopts::value<std::string>()->default_value("auto"))
    ("json", "Write the results as JSON to FILE", cxxopts::value<std::string>()->default_value(""))
    ("corrupt-rank", "Test hook: rank R spoils one element of every result, so the check must fail", cxxopts::value<int>()->default_value("-1"))
    ("h,help", "Show this help");
  // clang-format on
  return o;
}

void read_config(const cxxopts::ParseResult& r, BenchAllreduceConfig& c) {
  c.min_bytes = parse_bytes("--min-bytes", r["min-bytes"].as<std::string>());
  c.max_bytes = parse_bytes("--max-bytes", r["max-bytes"].as<std::string>());
  if (c.min_bytes > c.max_bytes)
    throw UsageError(fmt::format("--min-bytes ({}) is larger than --max-bytes ({})", c.min_bytes, c.max_bytes));
  c.iters = r["iters"].as<int>();
  c.warmup = r["warmup"].as<int>();
  if (c.iters < 1 || c.iters > 100000) throw UsageError(fmt::format("--iters: must be in [1, 100000], got {}", c.iters));
  if (c.warmup < 0 || c.warmup > 100000)
    throw UsageError(fmt::format("--warmup: must be in [0, 100000], got {}", c.warmup));
  const std::string paths = r["paths"].as<std::string>();
  if (paths != "all")
    c.paths = parse_list<BenchPath>("--paths", paths, parse_path, "flat, shm, hierarchical, nccl");
  c.dtypes = parse_list<DType>("--dtypes", r["dtypes"].as<std::string>(), parse_dtype, "float32, bf16");
  const std::string device = r["device"].as<std::string>();
  std::optional<DeviceRequest> request = DeviceRequest::parse(device);
  if (!request) throw UsageError(fmt::format("--device: expected auto, cpu, cuda or cuda:N, got '{}'", device));
  c.runtime.device = *request;
  c.json_path = r["json"].as<std::string>();
  c.corrupt_rank = r["corrupt-rank"].as<int>();
}

}  // namespace

const char* bench_path_name(BenchPath path) {
  switch (path) {
    case BenchPath::kFlat: return "flat";
    case BenchPath::kShm: return "shm";
    case BenchPath::kHierarchical: return "hierarchical";
    case BenchPath::kNccl: return "nccl";
  }
  return "?";
}

ParsedBenchAllreduce parse_bench_allreduce_options(const std::vector<std::string>& args) {
  cxxopts::Options options = make_options();
  const ParsedFlags flags = parse_flags(options, args);
  ParsedBenchAllreduce out;
  if (flags.help) {
    out.help = true;
    out.help_text = flags.help_text;
    return out;
  }
  const cxxopts::ParseResult& r = flags.result;
  read_config(r, out.config);
  return out;
}

}  // namespace dtrain
