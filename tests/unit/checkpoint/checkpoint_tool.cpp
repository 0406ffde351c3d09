// A helper the checkpoint tests run in other processes and mount namespaces, and the PyTorch
// test runs to write and read files on dtrain's side:
//   save DIR STEP NUMEL        write synthetic_snapshot(STEP, NUMEL) into DIR (keep 2)
//   check DIR STEP NUMEL       read DIR's latest checkpoint; it must be that snapshot
//   write-sample PATH          a safetensors file of every dtype with known values
//   check-sample PATH          PATH must hold what write-sample writes (from any writer)
//   write-mlp PATH             the seed MLP's initial parameters (784-256-10, seed 0)
//   save-sharded DIR STEP NUMEL SHARDS
//                              synthetic_snapshot(STEP, NUMEL) with its optimizer state in SHARDS
//                              shard files, each tensor cut into SHARDS contiguous pieces
// Exit 0 on success; 1 with one line on stderr on failure.
#include <cstdio>
#include <cstring>
#include <string>

#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/durable_file.h"
#include "checkpoint/optimizer_shards.h"
#include "core/error.h"
#include "model/models.h"
#include "synthetic.h"

namespace dtrain {
namespace {

using safetensors::Dtype;
using safetensors::HostTensor;

// Element i of a sample tensor, as the bytes of its dtype (values Python recomputes).
HostTensor sample_tensor(const std::string& name, Dtype dtype, Shape shape) {
  const int64_t n = shape_numel(shape);
  const size_t size = dtype_size(dtype);
  std::shared_ptr<std::byte> data(new std::byte[n * size + 1], std::default_delete<std::byte[]>());
  for (int64_t i = 0; i < n; ++i) {
    std::byte* p = data.get() + i * size;
    const double v = static_cast<double>(i) - 3.5;
    switch (dtype) {
      case Dtype::kF32: { float f = static_cast<float>(v / 8); std::memcpy(p, &f, 4); break; }
      case Dtype::kF64: { double d = v / 8; std::memcpy(p, &d, 8); break; }
      case Dtype::kI32: { int32_t x = static_cast<int32_t>(i * 1000 - 7); std::memcpy(p, &x, 4); break; }
      case Dtype::kI64: { int64_t x = (int64_t{1} << 40) + i; std::memcpy(p, &x, 8); break; }
      case Dtype::kU8: { uint8_t x = static_cast<uint8_t>(i * 37); std::memcpy(p, &x, 1); break; }
      case Dtype::kF16: { uint16_t h = static_cast<uint16_t>(0x3c00 + i); std::memcpy(p, &h, 2); break; }   // 1.0 + i ulp
      case Dtype::kBF16: { uint16_t h = static_cast<uint16_t>(0x3f80 + i); std::memcpy(p, &h, 2); break; }  // 1.0 + i ulp
      default: throw Error("sample dtype");
    }
  }
  return {name, dtype, std::move(shape), std::move(data), static_cast<size_t>(n) * size};
}

std::vector<HostTensor> sample_tensors() {
  std::vector<HostTensor> t;
  t.push_back(sample_tensor("bf16", Dtype::kBF16, {2, 3}));
  t.push_back(sample_tensor("f16", Dtype::kF16, {5}));
  t.push_back(sample_tensor("f32", Dtype::kF32, {3, 4}));
  t.push_back(sample_tensor("f64", Dtype::kF64, {2}));
  t.push_back(sample_tensor("i32", Dtype::kI32, {4}));
  t.push_back(sample_tensor("i64", Dtype::kI64, {3}));
  t.push_back(sample_tensor("scalar", Dtype::kF32, {}));
  t.push_back(sample_tensor("u8", Dtype::kU8, {7}));
  t.push_back(sample_tensor("z.empty", Dtype::kF32, {0, 3}));
  return t;
}

const safetensors::Metadata kSampleMetadata = {{"format", "pt"}, {"written_by", "dtrain"}};

int check_sample(const std::string& path) {
  safetensors::File file = safetensors::read_file(path);
  const auto want = sample_tensors();
  if (file.header().tensors.size() != want.size()) throw Error(path + ": wrong tensor count");
  for (const HostTensor& t : want) {
    const auto& info = file.at(t.name);
    if (info.dtype != t.dtype || info.shape != t.shape) throw Error(path + ": wrong dtype/shape for " + t.name);
    auto got = file.bytes(info);
    if (got.size() != t.nbytes || std::memcmp(got.data(), t.data.get(), t.nbytes) != 0)
      throw Error(path + ": wrong values for " + t.name);
  }
  if (file.metadata().at("format") != "pt") throw Error(path + ": wrong metadata");
  return 0;
}

// Note [Sharded optimizer state]'s files as a ZeRO run at SHARDS ranks would leave them.
void save_sharded(const std::string& dir, int64_t step, int64_t numel, int shards) {
  auto snapshot = testing::synthetic_snapshot(step, numel);
  const checkpoint::CheckpointWriterOptions options{.dir = dir};
  snapshot.sharded = std::make_shared<checkpoint::ShardedSave>(options, step, shards);
  for (int r = 0; r < shards; ++r) {
    checkpoint::ShardManifest m;
    m.metadata = snapshot.optimizer_metadata;
    std::vector<std::span<const std::byte>> bytes;
    for (const HostTensor& t : snapshot.optimizer) {
      const int64_t n = shape_numel(t.shape), lo = n * r / shards, hi = n * (r + 1) / shards;
      m.tensors.push_back({{t.name, lo, hi - lo, t.shape}, t.dtype, {hi - lo}});
      bytes.push_back(t.bytes().subspan(static_cast<size_t>(lo) * 4, static_cast<size_t>(hi - lo) * 4));
    }
    const std::string name = checkpoint::optimizer_shard_name(r, shards);
    auto file = snapshot.sharded->create(name);
    const auto specs = m.specs();
    safetensors::write_header(*file, specs, m.file_metadata());
    for (size_t i : safetensors::data_order(specs)) file->write(bytes[i]);
    file->commit();
    snapshot.sharded->add(name, *file);
  }
  snapshot.optimizer.clear();
  checkpoint::write_checkpoint(options, snapshot);
}

int run(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if ((cmd == "save" || cmd == "check") && argc == 5) {
    const int64_t step = std::stoll(argv[3]), numel = std::stoll(argv[4]);
    if (cmd == "save") {
      auto snapshot = testing::synthetic_snapshot(step, numel);
      checkpoint::write_checkpoint({.dir = argv[2]}, snapshot);
      return 0;
    }
    auto loaded = checkpoint::read_checkpoint(argv[2]);
    if (loaded.state.global_step != step) throw Error(fmt::format("loaded step {}, expected {}", loaded.state.global_step, step));
    if (auto m = testing::synthetic_mismatch(loaded, step, numel); !m.empty()) throw Error(m);
    return 0;
  }
  if (cmd == "write-sample" && argc == 3) {
    safetensors::write_file(argv[2], safetensors::refs(sample_tensors()), kSampleMetadata);
    return 0;
  }
  if (cmd == "check-sample" && argc == 3) return check_sample(argv[2]);
  if (cmd == "write-mlp" && argc == 3) {
    auto model = build_model(ModelSpec{}, {1, 28, 28}, 10, Device::cpu(), 0);
    std::vector<HostTensor> params;
    for (Parameter* p : model->parameters()) params.push_back(safetensors::host_copy(p->name, p->value));
    safetensors::write_file(argv[2], safetensors::refs(params), {{"format", "pt"}});
    return 0;
  }
  if (cmd == "save-sharded" && argc == 6) {
    save_sharded(argv[2], std::stoll(argv[3]), std::stoll(argv[4]), std::stoi(argv[5]));
    return 0;
  }
  std::fprintf(stderr,
               "usage: checkpoint_tool save|check DIR STEP NUMEL | save-sharded DIR STEP NUMEL SHARDS | "
               "write-sample|check-sample|write-mlp PATH\n");
  return 2;
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  try {
    return dtrain::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
