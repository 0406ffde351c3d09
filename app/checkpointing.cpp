#include "app/checkpointing.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>

#include <fmt/format.h>

#include "app/root_broadcast.h"
#include "checkpoint/checkpoint_layout.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/finite.h"

namespace dtrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A float as the shortest decimal that reads back to it (0.01, not 0.009999999776482582), so
// that state.json and its error lines show what the user typed.
double decimal(float v) { return std::strtod(fmt::format("{}", v).c_str(), nullptr); }

json lr_schedule_config(const TrainConfig& c) {
  json s = {{"kind", lr_schedule_name(c.lr_schedule)}};
  if (c.lr_schedule == LrSchedule::Kind::kStep) {
    s["step_size"] = c.lr_step_size;
    s["step_gamma"] = decimal(c.lr_gamma);  // named so that "kind" sorts first
  }
  if (c.lr_schedule == LrSchedule::Kind::kCosine) s["period_epochs"] = c.epochs;  // the schedule's T_max
  return s;
}

json optimizer_config(const OptimizerSpec& o) {
  // "algorithm" sorts first, so that another optimizer is reported as such.
  json j = {{"algorithm", optimizer_name(o.kind)}, {"lr", decimal(o.lr)}, {"weight_decay", decimal(o.weight_decay)}};
  if (o.kind == OptimizerKind::kSgd) {
    j["momentum"] = decimal(o.momentum);
    j["nesterov"] = o.nesterov;
  } else {
    j["eps"] = decimal(o.eps);
  }
  return j;
}

std::string as_string(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

safetensors::File file_from(const std::string& bytes, const std::string& source) {
  auto data = std::make_unique<std::byte[]>(bytes.size());
  std::memcpy(data.get(), bytes.data(), bytes.size());
  return safetensors::File(std::move(data), bytes.size(), source);
}

// A NaN or an infinity loaded would poison every step after it, silently (Note [Stopping on
// non-finite values] in app/divergence.h): refused, naming the file and the tensor.
void refuse_nonfinite(const safetensors::File& file) {
  if (const std::string bad = checkpoint::first_nonfinite_tensor(file); !bad.empty())
    throw Error(fmt::format("{}: {}", file.source(), bad));
}

void load_parameters(const safetensors::File& file, Module& model) {
  refuse_nonfinite(file);
  std::vector<safetensors::NamedTarget> targets;
  for (Parameter* p : model.parameters()) targets.push_back({p->name, &p->value});
  safetensors::load_named(file, targets);
}

OptimizerState optimizer_state_from(const safetensors::File& file) {
  OptimizerState state;
  for (const safetensors::TensorInfo& info : file.header().tensors) {
    if (info.dtype == safetensors::Dtype::kI64)
      state.counts.push_back({info.name, file.i64_scalar(info.name)});
    else
      state.tensors.push_back({info.name, file.to_tensor(info.name)});
  }
  return state;
}

json rng_state(Module& model) {
  std::vector<uint64_t> counters;
  for (uint64_t* c : model.rng_counters()) counters.push_back(*c);
  return {{"dropout_counters", counters}};
}

void restore_rng(const json& rng, Module& model, const std::string& source) {
  const std::vector<uint64_t*> counters = model.rng_counters();
  const json* saved = rng.is_object() && rng.contains("dropout_counters") ? &rng["dropout_counters"] : nullptr;
  bool ok = saved && saved->is_array() && saved->size() == counters.size();
  for (size_t i = 0; ok && i < counters.size(); ++i) ok = (*saved)[i].is_number_unsigned();
  if (!ok)
    throw Error(fmt::format("{}: rng.dropout_counters: expected {} counter(s), one per Dropout layer, got {}", source,
                            counters.size(), saved ? saved->dump() : "none"));
  for (size_t i = 0; i < counters.size(); ++i) *counters[i] = (*saved)[i].get<uint64_t>();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace

json bucket_layout_json(const BucketLayout& layout) {
  return {{"ready_order", layout.ready_order},
          {"first_bucket_bytes", layout.first_bucket_bytes},
          {"bucket_cap_bytes", layout.bucket_cap_bytes}};
}

BucketLayout bucket_layout_from_json(const json& buckets, size_t params, const std::string& source) {
  auto fail = [&](const std::string& field, const std::string& problem) {
    throw Error(fmt::format("{}: buckets{}: {}", source, field, problem));
  };
  if (!buckets.is_object()) fail("", "expected an object");
  auto bytes = [&](const char* name) {
    const json* v = buckets.contains(name) ? &buckets[name] : nullptr;
    if (!v || !v->is_number_integer() || v->get<int64_t>() <= 0)
      fail(fmt::format(".{}", name), "expected a positive whole number");
    return v->get<size_t>();
  };
  BucketLayout layout;
  layout.first_bucket_bytes = bytes("first_bucket_bytes");
  layout.bucket_cap_bytes = bytes("bucket_cap_bytes");
  const json* order = buckets.contains("ready_order") ? &buckets["ready_order"] : nullptr;
  if (!order || !order->is_array()) fail(".ready_order", "expected an array of parameter indices");
  for (const json& i : *order) {
    if (!i.is_number_integer() || i.get<int64_t>() < 0)
      fail(".ready_order", fmt::format("{} is not a parameter index", i.dump()));
    layout.ready_order.push_back(i.get<size_t>());
  }
  const std::string wrong = check_ready_order(layout.ready_order, params);
  if (!wrong.empty()) fail(".ready_order", wrong);
  return layout;
}

json resume_config(const TrainConfig& c) {
  // "architecture" sorts first, so that another model is reported as such, not by its widths.
  json model = {{"architecture", model_kind_name(c.model.kind)}, {"dropout", decimal(c.model.dropout)}};
  if (c.model.kind == ModelKind::kMlp) model["hidden"] = c.model.hidden;
  if (c.data.classes > 0) model["classes"] = c.data.classes;  // only when given: older checkpoints still match
  return {
      {"model", model},
      {"optimizer", optimizer_config(c.optimizer)},
      {"lr_schedule", lr_schedule_config(c)},
      {"batch_size", c.batch_size},
      {"accumulate", c.accumulate},
      {"amp", c.amp == AmpMode::kBf16 ? "bf16" : "off"},
      {"ddp",
       {{"comm_hook", comm_hook_name(c.ddp.comm_hook)},
        {"bucket_cap_bytes", c.ddp.bucket_cap_auto ? json("auto") : json(c.ddp.bucket_cap_bytes)},
        {"first_bucket_bytes", c.ddp.first_bucket_bytes}}},
      {"data",
       {{"train_limit", c.data.train_limit},
        {"test_limit", c.data.test_limit},
        {"normalize", {decimal(c.data.normalize.mean), decimal(c.data.normalize.std)}},
        {"shuffle", c.data.shuffle},
        {"sampler", sampler_tail_name(c.data.sampler)}}},
      {"seed", c.seed},
  };
}

CheckpointSaver::CheckpointSaver(Communicator& control, const CheckpointSettings& settings) : settings_(settings) {
  // Every rank joins, so that rank 0 failing to take the lock stops them all alike.
  broadcast_from_root(control, [&]() -> std::vector<std::string> {
    if (settings.dir.empty()) return {};
    try {
      lock_ = std::make_unique<checkpoint::DirectoryLock>(settings.dir);
    } catch (const checkpoint::DirectoryInUse& e) {
      throw Error(fmt::format("{}; one job per --checkpoint-dir", e.what()));
    }
    writer_ = std::make_unique<checkpoint::CheckpointWriter>(
        checkpoint::CheckpointWriterOptions{.dir = settings.dir, .keep = settings.keep});
    return {};
  });
}

std::string CheckpointSaver::snapshot(checkpoint::TrainingState state, Module& model, const Optimizer& optimizer,
                                      const safetensors::Metadata& architecture) {
  pending_.reset();
  if (!writer_) return "";
  const auto t0 = std::chrono::steady_clock::now();
  // The previous save's buffers return to the pool once written: wait for them rather than
  // take a second set (and so never queue more than one save).
  writer_->wait();
  const auto t1 = std::chrono::steady_clock::now();
  checkpoint::HostBufferPool* pool = &writer_->buffers();
  state.rng = rng_state(model);
  checkpoint::CheckpointSnapshot& snapshot = pending_.emplace();
  snapshot.state = std::move(state);
  for (Parameter* p : model.parameters()) snapshot.model.push_back(safetensors::host_copy(p->name, p->value, pool));
  snapshot.model_metadata = architecture;
  const OptimizerState optimizer_state = optimizer.export_state();
  for (const auto& e : optimizer_state.tensors) snapshot.optimizer.push_back(safetensors::host_copy(e.name, e.value, pool));
  for (const auto& c : optimizer_state.counts) snapshot.optimizer.push_back(safetensors::i64_scalar(c.name, c.value));
  snapshot.optimizer_metadata = {{"optimizer", optimizer_name(optimizer.kind())}};
  // One pass over the host copy just made: O(state), as the copy itself.
  std::string bad = checkpoint::first_nonfinite_tensor(snapshot.model);
  if (!bad.empty()) bad = fmt::format("{}: {}", checkpoint::kModelFile, bad);
  if (const std::string o = checkpoint::first_nonfinite_tensor(snapshot.optimizer); bad.empty() && !o.empty())
    bad = fmt::format("{}: {}", checkpoint::kOptimizerFile, o);
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  pending_previous_ms_ = ms(t0, t1);
  pending_snapshot_ms_ = ms(t1, std::chrono::steady_clock::now());
  return bad;
}

void CheckpointSaver::write() {
  if (!writer_ || !pending_) return;
  checkpoint::CheckpointSnapshot snapshot = std::move(*pending_);
  pending_.reset();
  last_path_ = (fs::path(settings_.dir) / checkpoint::step_dir_name(snapshot.state.global_step)).string();
  const auto t2 = std::chrono::steady_clock::now();
  if (settings_.background)
    writer_->save_async(std::move(snapshot));
  else
    writer_->save(std::move(snapshot));
  const auto t3 = std::chrono::steady_clock::now();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  // Training waited for the previous save, the snapshot and the write (the vote between the
  // last two is not the saver's).
  times_.previous_ms.push_back(pending_previous_ms_);
  times_.snapshot_ms.push_back(pending_snapshot_ms_);
  times_.write_ms.push_back(ms(t2, t3));
  times_.blocked_ms.push_back(pending_previous_ms_ + pending_snapshot_ms_ + ms(t2, t3));
}

void CheckpointSaver::wait() {
  if (writer_) writer_->wait();
}

bool CheckpointSaver::writing() const { return writer_ && writer_->writing(); }

void CheckpointSaver::record_step(double ms, bool while_writing) {
  if (!writer_) return;
  (while_writing ? times_.step_ms_while_writing : times_.step_ms_otherwise).push_back(ms);
}

std::string CheckpointSaver::summary() const {
  if (times_.blocked_ms.empty()) return "";
  return fmt::format(
      "checkpoint: {} save(s) to {} ({}): training waited {:.1f} ms per save (median; max {:.1f}; medians: {:.1f} "
      "for the previous save, {:.1f} snapshot, {:.1f} writing); {} step(s) ran while one was written, {:.2f} ms per "
      "step against {:.2f} ms otherwise (mean)",
      times_.blocked_ms.size(), settings_.dir, settings_.background ? "background writer" : "synchronous",
      median(times_.blocked_ms), *std::max_element(times_.blocked_ms.begin(), times_.blocked_ms.end()),
      median(times_.previous_ms), median(times_.snapshot_ms), median(times_.write_ms),
      times_.step_ms_while_writing.size(), mean(times_.step_ms_while_writing), mean(times_.step_ms_otherwise));
}

std::optional<Resumed> restore_checkpoint(Communicator& control, const TrainConfig& c, Module& model,
                                          Optimizer& optimizer) {
  const CheckpointSettings& k = c.checkpoints;
  if (k.resume == ResumeMode::kNone) return std::nullopt;
  const json config = resume_config(c);
  const std::vector<std::string> parts = broadcast_from_root(control, [&]() -> std::vector<std::string> {
    std::optional<checkpoint::LoadedCheckpoint> loaded;
    if (k.resume == ResumeMode::kAuto)
      loaded = checkpoint::read_newest(k.dir);
    else
      loaded = checkpoint::read_checkpoint(k.resume_path);
    if (!loaded) return {};
    checkpoint::check_config_matches(*loaded, config, {});
    return {loaded->path.string(), checkpoint::encode_state(loaded->state), as_string(loaded->model.file_bytes()),
            as_string(loaded->optimizer.file_bytes()), loaded->chosen_because};
  });
  if (parts.empty()) return std::nullopt;
  return agreed([&] {
    const fs::path dir = parts[0];
    Resumed resumed{checkpoint::decode_state(parts[1], (dir / checkpoint::kStateFile).string()), parts[0], {},
                    parts[4]};
    load_parameters(file_from(parts[2], (dir / checkpoint::kModelFile).string()), model);
    const std::string optimizer_source = (dir / checkpoint::kOptimizerFile).string();
    const safetensors::File optimizer_file = file_from(parts[3], optimizer_source);
    refuse_nonfinite(optimizer_file);
    try {
      optimizer.import_state(optimizer_state_from(optimizer_file));
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", optimizer_source, e.what()));
    }
    restore_rng(resumed.state.rng, model, (dir / checkpoint::kStateFile).string());
    if (!resumed.state.buckets.is_null())
      resumed.buckets = bucket_layout_from_json(resumed.state.buckets, model.parameters().size(),
                                                (dir / checkpoint::kStateFile).string());
    return resumed;
  });
}

void load_initial_weights(Communicator& control, const std::string& path, Module& model) {
  const std::vector<std::string> parts = broadcast_from_root(
      control, [&]() -> std::vector<std::string> { return {as_string(safetensors::read_file(path).file_bytes())}; });
  agreed([&] { load_parameters(file_from(parts[0], path), model); });
}

safetensors::File read_weights_on_root(Communicator& control, const std::string& path, std::string* chosen_because) {
  const std::vector<std::string> parts = broadcast_from_root(control, [&]() -> std::vector<std::string> {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {  // a checkpoint, or a checkpoint directory: validated whole
      checkpoint::LoadedCheckpoint loaded = checkpoint::read_checkpoint(path);
      return {as_string(loaded.model.file_bytes()), loaded.model.source(), loaded.chosen_because};
    }
    safetensors::File file = safetensors::read_file(path);
    return {as_string(file.file_bytes()), file.source(), ""};
  });
  if (chosen_because) *chosen_because = parts[2];
  return agreed([&] { return file_from(parts[0], parts[1]); });
}

}  // namespace dtrain
