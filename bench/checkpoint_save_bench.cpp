// How long a checkpoint save blocks training, with and without the background writer, for the
// seed MLP (784-256-10, ~0.8 MB of parameters) and a >= 50 M-parameter MLP, SGD with momentum
// (so each save writes the parameters and as many bytes of momentum). Every save is read back
// and compared byte for byte: the figures are printed next to "verified".
//   dtrain_checkpoint_bench [DIR] [REPEATS]   (DIR default /tmp/dtrain_checkpoint_bench)
// Prints per size: the snapshot (host copies taken between steps), a synchronous save (the
// caller blocked for snapshot + write + fsync), save_async (blocked for the snapshot only) and
// how long the background write then took; and the step time of the seed MLP training while a
// background save of that size is in flight, against its step time alone (the hiccup).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"

namespace dtrain {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Training {
  std::unique_ptr<Sequential> model;
  std::unique_ptr<Sgd> sgd;
  CrossEntropyLoss loss;
  Tensor x, y;
  int64_t steps = 0;

  Training(std::vector<int64_t> hidden, int64_t batch)
      : model(build_model(ModelSpec{ModelKind::kMlp, std::move(hidden)}, {1, 28, 28}, 10, Device::cpu(), 0)),
        sgd(std::make_unique<Sgd>(model->parameters(), SgdOptions{0.01f, 0.9f})),
        x(Tensor::empty({batch, 1, 28, 28})),
        y(Tensor::zeros({batch}, Device::cpu(), DType::kI32)) {
    for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = static_cast<float>(i % 255) / 255.f;
  }
  void step() {
    sgd->zero_grad();
    loss.forward(model->forward(x), y);
    model->backward(loss.backward(), false);
    sgd->step();
    ++steps;
  }
  int64_t parameter_count() {
    int64_t n = 0;
    for (Parameter* p : model->parameters()) n += p->value.numel();
    return n;
  }
  // What the trainer does between two steps: host copies of everything a checkpoint holds.
  checkpoint::CheckpointSnapshot snapshot(checkpoint::HostBufferPool* pool) {
    checkpoint::CheckpointSnapshot s;
    s.state.global_step = steps;
    s.state.config = {{"model", "mlp"}};
    for (Parameter* p : model->parameters()) s.model.push_back(safetensors::host_copy(p->name, p->value, pool));
    for (auto& e : sgd->export_state().tensors) s.optimizer.push_back(safetensors::host_copy(e.name, e.value, pool));
    return s;
  }
};

bool verify(const std::filesystem::path& dir, Training& t) {
  checkpoint::LoadedCheckpoint c = checkpoint::read_checkpoint(dir);
  if (c.state.global_step != t.steps) return false;
  for (Parameter* p : t.model->parameters()) {
    auto bytes = c.model.bytes(c.model.at(p->name));
    if (bytes.size() != p->value.nbytes() || std::memcmp(bytes.data(), p->value.raw(), bytes.size()) != 0) return false;
  }
  return true;
}

// One way of saving, timed over `repeats` saves: how long the caller is blocked (snapshot
// included) and, for save_async, how long until the checkpoint is complete.
void measure_saves(const char* label, Training& t, const std::filesystem::path& dir, int repeats) {
  std::filesystem::remove_all(dir);
  checkpoint::CheckpointWriter writer({.dir = dir, .keep = 2, .fault_after_bytes = std::nullopt});
  struct Mode {
    const char* name;
    bool async, pooled;
  };
  uint64_t bytes = 0;
  for (Mode mode : {Mode{"sync, fresh buffers ", false, false}, Mode{"sync, pooled buffers", false, true},
                    Mode{"async, fresh buffers", true, false}, Mode{"async, pooled buffers", true, true}}) {
    std::vector<double> snap, blocked, complete;
    bool ok = true;
    for (int r = 0; r < repeats; ++r) {
      t.step();
      const auto t0 = Clock::now();
      checkpoint::CheckpointSnapshot s = t.snapshot(mode.pooled ? &writer.buffers() : nullptr);
      snap.push_back(ms_since(t0));
      if (mode.async) {
        writer.save_async(std::move(s));
        blocked.push_back(ms_since(t0));
        writer.wait();
      } else {
        writer.save(std::move(s));
        blocked.push_back(ms_since(t0));
      }
      complete.push_back(ms_since(t0));
      ok = ok && verify(dir, t);
    }
    if (!bytes)
      for (const auto& e : std::filesystem::directory_iterator(*checkpoint::find_latest(dir)))
        bytes += std::filesystem::file_size(e.path());
    fmt::print("{:<6} {:>5.1f} M params, {:>6.1f} MB | {} | snapshot {:>6.1f} ms | caller blocked {:>7.1f} ms | "
               "complete after {:>7.1f} ms ({:>4.0f} MB/s) | {} (medians of {})\n",
               label, t.parameter_count() / 1e6, bytes / 1e6, mode.name, median(snap), median(blocked),
               median(complete), bytes / 1e3 / median(complete), ok ? "verified" : "MISMATCH", repeats);
  }
}

// Seed-MLP step times while a background save of `saved` is in flight, against alone. `saved`
// must not be `trained` (the check compares the file with `saved` afterwards).
void measure_hiccup(const char* label, Training& saved, Training& trained, const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  checkpoint::CheckpointWriter writer({.dir = dir, .keep = 2, .fault_after_bytes = std::nullopt});
  writer.save(saved.snapshot(&writer.buffers()));  // a run's later saves find their buffers mapped
  saved.step();
  std::vector<double> alone, during;
  for (int i = 0; i < 100; ++i) {
    const auto t0 = Clock::now();
    trained.step();
    alone.push_back(ms_since(t0));
  }
  const auto t0 = Clock::now();
  writer.save_async(saved.snapshot(&writer.buffers()));
  const double blocked_ms = ms_since(t0);
  while (writer.writing() && ms_since(t0) < 60000) {
    const auto s0 = Clock::now();
    trained.step();
    during.push_back(ms_since(s0));
  }
  const double write_ms = ms_since(t0);
  writer.wait();
  const bool ok = verify(dir, saved);
  fmt::print("{:<6} hiccup: seed-MLP step alone {:.2f} ms median / {:.2f} max (100 steps); while the save is written "
             "({:.0f} ms) {:.2f} ms median / {:.2f} max ({} steps); save_async blocked {:.1f} ms | {}\n",
             label, median(alone), *std::max_element(alone.begin(), alone.end()), write_ms, median(during),
             during.empty() ? 0 : *std::max_element(during.begin(), during.end()), during.size(), blocked_ms,
             ok ? "verified" : "MISMATCH");
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  const std::filesystem::path root = argc > 1 ? argv[1] : "/tmp/dtrain_checkpoint_bench";
  const int repeats = argc > 2 ? std::stoi(argv[2]) : 5;
  dtrain::Training seed({256}, 64), seed_saved({256}, 64);
  seed.step();
  seed_saved.step();
  dtrain::measure_saves("small", seed, root / "small", repeats);
  dtrain::Training large({4096, 4096, 4096, 4096}, 2);
  large.step();
  dtrain::measure_saves("large", large, root / "large", repeats);
  dtrain::measure_hiccup("small", seed_saved, seed, root / "hiccup-small");
  dtrain::measure_hiccup("large", large, seed, root / "hiccup-large");
  std::filesystem::remove_all(root);
  return 0;
}
