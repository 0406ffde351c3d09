#include "train/checkpointer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <string>

#include <fmt/format.h>

#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/directory_lock.h"
#include "checkpoint/finite.h"
#include "comm/exchange.h"
#include "core/memory.h"
#include "train/root_broadcast.h"

namespace dtrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
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
// non-finite values] in dtrain's app/divergence.h): refused, naming the file and the tensor.
void refuse_nonfinite(const safetensors::File& file) {
  if (const std::string bad = checkpoint::first_nonfinite_tensor(file); !bad.empty())
    throw Error(fmt::format("{}: {}", file.source(), bad));
}

void load_parameters(const safetensors::File& file, Module& model) {
  refuse_nonfinite(file);
  std::vector<safetensors::NamedTarget> targets;
  for (const NamedTensor& t : state_tensors(model)) targets.push_back({*t.name, t.value});  // buffers too
  safetensors::load_named(file, targets);
}

// The caller's RNG state (an object, or nothing) with the model's Dropout counters added.
json with_dropout_counters(json rng, Module& model) {
  if (!rng.is_object()) rng = json::object();
  std::vector<uint64_t> counters;
  for (uint64_t* c : model.rng_counters()) counters.push_back(*c);
  rng["dropout_counters"] = counters;
  return rng;
}

// `model`'s Dropout counters from the saved list of the whole model's `whole` (`model`'s own
// count unless `model` is a pipeline stage: Note [Pipeline dropout]), `model`'s from `first` on.
void restore_rng(const json& rng, Module& model, const std::string& source, size_t first = 0,
                 std::optional<size_t> whole = std::nullopt) {
  const std::vector<uint64_t*> counters = model.rng_counters();
  const size_t expected = whole.value_or(counters.size());
  DTRAIN_CHECK(first + counters.size() <= expected, "the stage's Dropout counters {}..{} are not among the model's {}",
               first, first + counters.size(), expected);
  const json* saved = rng.is_object() && rng.contains("dropout_counters") ? &rng["dropout_counters"] : nullptr;
  bool ok = saved && saved->is_array() && saved->size() == expected;
  for (size_t i = 0; ok && i < expected; ++i) ok = (*saved)[i].is_number_unsigned();
  if (!ok)
    throw Error(fmt::format("{}: rng.dropout_counters: expected {} counter(s), one per Dropout layer, got {}", source,
                            expected, saved ? saved->dump() : "none"));
  for (size_t i = 0; i < counters.size(); ++i) *counters[i] = (*saved)[first + i].get<uint64_t>();
}

// Note [Pipeline dropout] (pipeline/pipeline_stage.h): the unsplit model's Dropout counters,
// in its layers' order, from the stages' holders (one a stage, in stage order by world rank:
// Note [Pipeline grid]); collective.
json whole_dropout_counters(Communicator& control, Module& stage, bool holds) {
  std::vector<int64_t> mine;
  if (holds)
    for (uint64_t* c : stage.rng_counters()) mine.push_back(static_cast<int64_t>(*c));
  const auto n = static_cast<size_t>(control.size());
  std::vector<int64_t> counts(n);
  const auto count = static_cast<int64_t>(mine.size());
  control.allgather(&count, counts.data(), 1, DType::kI64);
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  if (most == 0) return json::array();
  mine.resize(static_cast<size_t>(most));
  std::vector<int64_t> all(n * static_cast<size_t>(most));
  control.allgather(mine.data(), all.data(), most, DType::kI64);
  json out = json::array();
  for (size_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < counts[r]; ++i) out.push_back(static_cast<uint64_t>(all[r * static_cast<size_t>(most) + i]));
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// The name errors about the optimizer state carry: its file, or its shards.
std::string optimizer_source(const fs::path& dir, const checkpoint::TrainingState& state) {
  if (state.files.contains(std::string(checkpoint::kOptimizerFile))) return (dir / checkpoint::kOptimizerFile).string();
  return (dir / fmt::format("optimizer-rank*-of-{}.safetensors", state.optimizer_shards)).string();
}

// Every rank takes its stage's tensors of `whole` (Note [Pipeline checkpoints]) from the bytes
// rank 0's `read_on_root` gives for each name, one tensor at a time.
void receive_stage_tensors(Communicator& control, Module& stage, std::span<const safetensors::TensorSpec> whole,
                           const std::string& source, const std::function<std::string(const std::string&)>& read_on_root) {
  std::map<std::string, Tensor*> mine;
  for (const NamedTensor& t : state_tensors(stage)) mine[*t.name] = t.value;
  for (const safetensors::TensorSpec& spec : whole) {
    const std::vector<std::string> bytes =
        broadcast_from_root(control, [&]() -> std::vector<std::string> { return {read_on_root(spec.name)}; });
    if (auto it = mine.find(spec.name); it != mine.end()) {
      DTRAIN_CHECK(bytes[0].size() == static_cast<size_t>(it->second->nbytes()), "{}: {} bytes for {}", source,
                   bytes[0].size(), spec.name);
      copy_bytes(it->second->raw(), it->second->device(), bytes[0].data(), Device::cpu(), it->second->nbytes());
      mine.erase(it);
    }
  }
  DTRAIN_CHECK(mine.empty(), "{}: the stage's tensor '{}' is not among the whole model's", source, mine.begin()->first);
}

// Collective, Note [Pipeline checkpoints]: drops from `state` (this rank's export) the entries of
// the parameters of `stage` that a lower stage holds too (a tied weight on the first and the last
// stage, Note [Tied stages] in pipeline/pipeline_stage.h): both copies took the same steps, so
// their state is saved once, by the stage whose value model.safetensors takes (under ZeRO, by
// all of that stage's replicas, each its slice).
void drop_state_held_below(Communicator& control, Module& stage, int stage_index, OptimizerState& state) {
  std::string names = fmt::format("{}\n", stage_index);
  for (const Parameter* p : stage.parameters()) names += p->name + "\n";
  std::set<std::string> below;
  for (const std::string& other : allgather_strings(control, names)) {
    size_t at = other.find('\n') + 1;
    if (std::stoi(other.substr(0, at)) >= stage_index) continue;
    for (size_t nl; (nl = other.find('\n', at)) != std::string::npos; at = nl + 1) below.insert(other.substr(at, nl - at));
  }
  // An entry is "<parameter>.<key>" (Optimizer::export_state), the key without a dot.
  const auto of_below = [&](const std::string& entry) { return below.contains(entry.substr(0, entry.rfind('.'))); };
  std::erase_if(state.tensors, [&](const OptimizerState::Entry& e) { return of_below(e.name); });
  std::erase_if(state.counts, [&](const OptimizerState::Count& c) { return of_below(c.name); });
}

// Whether `optimizer` updates only part of `stage`'s parameters: ZeRO (Note [Pipeline ZeRO-1]
// in app/pipeline_zero.h), each replica its chunk.
bool updates_part_of(const Optimizer& optimizer, Module& stage) {
  int64_t owned = 0, all = 0;
  for (const Optimizer::OwnedPart& part : optimizer.owned_parts()) owned += part.count;
  for (const Parameter* p : stage.parameters()) all += p->value.numel();
  return owned < all;
}

// Rank 0 reads (`read`: nullopt when there is nothing to resume) and checks the config; every
// rank loads the same model bytes, so that a checkpoint that does not fit fails alike everywhere,
// and receives its optimizer state from rank 0's files in chunks (train/optimizer_transfer.h).
std::optional<Resumed> restore(Communicator& control,
                               const std::function<std::optional<checkpoint::LoadedCheckpoint>()>& read,
                               const json& config, Module& model, Optimizer& optimizer, const PiecesFor& pieces_for,
                               const StageOf& stage_of) {
  const bool stage = !stage_of.tensors.empty();
  std::optional<checkpoint::LoadedCheckpoint> loaded;  // rank 0's
  const std::vector<std::string> parts = broadcast_from_root(control, [&]() -> std::vector<std::string> {
    loaded = read();
    if (!loaded) return {};
    if (!config.is_null()) checkpoint::check_config_matches(*loaded, config, {});
    if (stage) {  // the model's checks here; its tensors are sent one at a time below
      refuse_nonfinite(loaded->model);
      safetensors::check_holds(loaded->model.header(), loaded->model.source(), stage_of.tensors);
    }
    return {loaded->path.string(), checkpoint::encode_state(loaded->state),
            stage ? std::string() : as_string(loaded->model.file_bytes()), loaded->chosen_because,
            loaded->optimizer.nonfinite()};
  });
  if (parts.empty()) return std::nullopt;
  const fs::path dir = parts[0];
  const std::string state_source = (dir / checkpoint::kStateFile).string();
  Resumed resumed = agreed([&] {
    Resumed r{checkpoint::decode_state(parts[1], state_source), parts[0], parts[3]};
    if (!stage) load_parameters(file_from(parts[2], (dir / checkpoint::kModelFile).string()), model);
    if (!parts[4].empty()) throw Error(parts[4]);  // a non-finite optimizer value, after the model's checks
    return r;
  });
  if (stage)
    receive_stage_tensors(control, model, stage_of.tensors, (dir / checkpoint::kModelFile).string(),
                          [&](const std::string& name) {
                            return as_string(loaded->model.bytes(loaded->model.at(name)));
                          });
  // Every rank decoded the same state: what it asks for may depend on it (ZeRO: the layout the
  // saving run settled on is applied first, so the pieces are those of the run's buckets).
  const WantedPieces pieces = agreed([&] { return pieces_for(resumed); });
  const OptimizerState state = receive_optimizer_state(control, loaded ? &loaded->optimizer : nullptr, pieces,
                                                       checkpoint::kStreamChunkBytes);
  // With pieces each rank imports other data, so the import may fail on some ranks alone: the
  // ranks share their outcome and all throw the first rank's error (none trains on alone, waiting
  // for the others until its collectives time out). Whole tensors fail alike everywhere.
  std::string failure;
  ErrorKind failure_kind = ErrorKind::kCheckpoint;
  try {
    optimizer.import_state(state);
  } catch (const Error& e) {
    failure = fmt::format("{}: {}", optimizer_source(dir, resumed.state), e.what());
    failure_kind = e.kind();  // out of memory stays so
  }
  if (pieces) {
    const std::vector<std::string> all =
        allgather_strings(control, failure.empty() ? "" : fmt::format("{}\n{}", static_cast<int>(failure_kind), failure));
    for (size_t r = 0; r < all.size(); ++r) {
      if (all[r].empty()) continue;
      const size_t nl = all[r].find('\n');
      throw AgreedError(fmt::format("rank {}: {}", r, all[r].substr(nl + 1)),
                        static_cast<ErrorKind>(std::stoi(all[r].substr(0, nl))));
    }
  } else if (!failure.empty()) {
    throw AgreedError(failure, failure_kind);
  }
  return agreed([&] {
    if (stage)
      restore_rng(resumed.state.rng, model, state_source, stage_of.first_counter, stage_of.whole_counters);
    else
      restore_rng(resumed.state.rng, model, state_source);
    return resumed;
  });
}

}  // namespace

Checkpointer::Checkpointer(Communicator& control, CheckpointerOptions options)
    : control_(control), options_(std::move(options)) {
  // Every rank joins, so that rank 0 failing to take the lock stops them all alike.
  broadcast_from_root(control, [&]() -> std::vector<std::string> {
    if (options_.dir.empty()) return {};
    try {
      lock_ = std::make_unique<checkpoint::DirectoryLock>(options_.dir);
    } catch (const checkpoint::DirectoryInUse& e) {
      throw Error(fmt::format("{}; {}", e.what(), options_.in_use_hint));
    }
    writer_ = std::make_unique<checkpoint::CheckpointWriter>(
        checkpoint::CheckpointWriterOptions{.dir = options_.dir, .keep = options_.keep});
    return {};
  });
}

Checkpointer::~Checkpointer() = default;

void Checkpointer::save(checkpoint::TrainingState state, Module& model, const Optimizer& optimizer,
                        const safetensors::Metadata& metadata) {
  // Whatever stops a rank's snapshot (an earlier save's error, a non-finite value: rank 0's, or
  // with sharded state any rank's slice) is every rank's, and nothing of this step is written.
  const std::string path = (fs::path(options_.dir) / checkpoint::step_dir_name(state.global_step)).string();
  std::string outcome;  // "" fine; "E<kind><message>" an error; "N<tensor>" a non-finite value
  try {
    if (const std::string bad = snapshot(std::move(state), model, optimizer, metadata); !bad.empty()) outcome = "N" + bad;
  } catch (const Error& e) {
    outcome = fmt::format("E{}{}", static_cast<int>(e.kind()), e.what());
  }
  for (const std::string& o : allgather_strings(control_, outcome)) {
    if (o.empty()) continue;
    discard();
    if (o[0] == 'E') throw AgreedError(o.substr(2), static_cast<ErrorKind>(o[1] - '0'));
    throw AgreedError(fmt::format("{}: not saved: {}", path, o.substr(1)));
  }
  if (pending_shards_) return write();  // collective, and agreed
  broadcast_from_root(control_, [&]() -> std::vector<std::string> {
    write();
    return {};
  });
}

void Checkpointer::save_stage(checkpoint::TrainingState state, Module& stage, const Optimizer& optimizer,
                              StageSeat seat, std::span<const safetensors::TensorSpec> whole,
                              const safetensors::Metadata& metadata) {
  if (options_.dir.empty()) return;
  const int64_t step = state.global_step;
  const std::string path = (fs::path(options_.dir) / checkpoint::step_dir_name(step)).string();
  const bool holds = seat.replica == 0;
  json dropout_counters = whole_dropout_counters(control_, stage, holds);
  OptimizerState parameters, optimizer_state;  // views: nothing copied
  if (holds)
    for (const NamedTensor& t : state_tensors(stage)) parameters.tensors.push_back({*t.name, *t.value});
  // Replica 0's state whole, or (ZeRO) every replica's slices: the shards then cover the
  // stage's state once, which a resume at any layout re-cuts (wanted_pieces).
  if (holds || updates_part_of(optimizer, stage)) optimizer_state = optimizer.export_state();
  drop_state_held_below(control_, stage, seat.stage, optimizer_state);
  // As save(): an earlier save's error, or a non-finite value on any rank, stops every rank.
  std::string outcome;
  try {
    if (writer_) writer_->wait();
    std::string bad = first_nonfinite_slice(parameters, std::string(checkpoint::kModelFile), options_.transfer_chunk_bytes);
    if (bad.empty())
      bad = first_nonfinite_slice(optimizer_state, checkpoint::optimizer_shard_name(control_.rank(), control_.size()),
                                  options_.transfer_chunk_bytes);
    if (!bad.empty()) outcome = "N" + bad;
  } catch (const Error& e) {
    outcome = fmt::format("E{}{}", static_cast<int>(e.kind()), e.what());
  }
  for (const std::string& o : allgather_strings(control_, outcome)) {
    if (o.empty()) continue;
    if (o[0] == 'E') throw AgreedError(o.substr(2), static_cast<ErrorKind>(o[1] - '0'));
    throw AgreedError(fmt::format("{}: not saved: {}", path, o.substr(1)));
  }
  std::shared_ptr<checkpoint::ShardedSave> save;
  broadcast_from_root(control_, [&]() -> std::vector<std::string> {
    save = std::make_shared<checkpoint::ShardedSave>(writer_->options(), step, control_.size());
    return {};
  });
  const safetensors::Metadata optimizer_metadata = {{"optimizer", optimizer_name(optimizer.kind())}};
  try {
    send_stage_model(control_, parameters, whole, metadata, std::string(checkpoint::kModelFile), save.get(),
                     options_.transfer_chunk_bytes);
    send_optimizer_shards(control_, optimizer_state, optimizer_metadata, save.get(), options_.transfer_chunk_bytes);
  } catch (const Error& e) {
    throw AgreedError(fmt::format("checkpoint {} not saved: {}", path, e.what()), e.kind());
  }
  broadcast_from_root(control_, [&]() -> std::vector<std::string> {
    checkpoint::CheckpointSnapshot snapshot;
    snapshot.state = std::move(state);
    if (!snapshot.state.rng.is_object()) snapshot.state.rng = json::object();
    snapshot.state.rng["dropout_counters"] = std::move(dropout_counters);
    snapshot.model_metadata = metadata;
    snapshot.optimizer_metadata = optimizer_metadata;
    snapshot.sharded = std::move(save);
    last_path_ = path;
    if (options_.background)
      writer_->save_async(std::move(snapshot));
    else
      writer_->save(std::move(snapshot));
    return {};
  });
  last_path_ = path;
}

void Checkpointer::finish() {
  broadcast_from_root(control_, [&]() -> std::vector<std::string> {
    wait();
    return {};
  });
}

std::optional<Resumed> Checkpointer::restore_latest(Module& model, Optimizer& optimizer, const json& config,
                                                    const WantedPieces& pieces) {
  return restore_newest(control_, options_.dir, model, optimizer, config, pieces);
}

std::string Checkpointer::snapshot(checkpoint::TrainingState state, Module& model, const Optimizer& optimizer,
                                   const safetensors::Metadata& metadata) {
  pending_.reset();
  pending_shards_.reset();
  if (options_.dir.empty()) return "";
  std::string bad;
  OptimizerState optimizer_state = optimizer.export_state();  // views: nothing copied yet
  if (agree_sharded(control_, optimizer_state)) {  // every rank checks its own slices, a chunk at a time
    const std::string file = checkpoint::optimizer_shard_name(control_.rank(), control_.size());
    bad = first_nonfinite_slice(optimizer_state, file, options_.transfer_chunk_bytes);
    pending_shards_ = std::move(optimizer_state);
    pending_shard_metadata_ = {{"optimizer", optimizer_name(optimizer.kind())}};
    pending_step_ = state.global_step;
  }
  if (!writer_) return bad;
  const auto t0 = Clock::now();
  // The previous save's buffers return to the pool once written: wait for them rather than
  // take a second set (and so never queue more than one save).
  writer_->wait();
  const auto t1 = Clock::now();
  checkpoint::HostBufferPool* pool = &writer_->buffers();
  state.rng = with_dropout_counters(std::move(state.rng), model);
  pending_ = std::make_unique<checkpoint::CheckpointSnapshot>();
  checkpoint::CheckpointSnapshot& snapshot = *pending_;
  snapshot.state = std::move(state);
  for (const NamedTensor& t : state_tensors(model))  // parameters, then buffers (BatchNorm's running statistics)
    snapshot.model.push_back(safetensors::host_copy(*t.name, *t.value, pool));
  snapshot.model_metadata = metadata;
  if (!pending_shards_) {
    for (const auto& e : optimizer_state.tensors) snapshot.optimizer.push_back(safetensors::host_copy(e.name, e.value, pool));
    for (const auto& c : optimizer_state.counts) snapshot.optimizer.push_back(safetensors::i64_scalar(c.name, c.value));
  }
  snapshot.optimizer_metadata = {{"optimizer", optimizer_name(optimizer.kind())}};
  // One pass over the host copy just made: O(state), as the copy itself.
  if (const std::string m = checkpoint::first_nonfinite_tensor(snapshot.model); !m.empty())
    bad = fmt::format("{}: {}", checkpoint::kModelFile, m);
  if (const std::string o = checkpoint::first_nonfinite_tensor(snapshot.optimizer); bad.empty() && !o.empty())
    bad = fmt::format("{}: {}", checkpoint::kOptimizerFile, o);
  pending_previous_ms_ = ms_between(t0, t1);
  pending_snapshot_ms_ = ms_between(t1, Clock::now());
  return bad;
}

void Checkpointer::write_sharded() {
  const OptimizerState state = std::move(*pending_shards_);
  pending_shards_.reset();
  // Rank 0 makes the save's temporary directory (its failure is every rank's), then every
  // rank's shard streams into it; the model and state.json follow as in any save.
  std::shared_ptr<checkpoint::ShardedSave> save;
  broadcast_from_root(control_, [&]() -> std::vector<std::string> {
    DTRAIN_CHECK(writer_ && pending_, "rank 0 holds no snapshot for the sharded save of step {}", pending_step_);
    save = std::make_shared<checkpoint::ShardedSave>(writer_->options(), pending_step_, control_.size());
    return {};
  });
  try {
    send_optimizer_shards(control_, state, pending_shard_metadata_, save.get(), options_.transfer_chunk_bytes);
  } catch (const Error& e) {
    pending_.reset();
    throw AgreedError(fmt::format("checkpoint {} not saved: {}",
                                  (fs::path(options_.dir) / checkpoint::step_dir_name(pending_step_)).string(), e.what()),
                      e.kind());
  }
  if (pending_) pending_->sharded = std::move(save);
}

void Checkpointer::write() {
  const auto t2 = Clock::now();
  if (pending_shards_) write_sharded();
  if (!writer_ || !pending_) return;
  checkpoint::CheckpointSnapshot snapshot = std::move(*pending_);
  pending_.reset();
  last_path_ = (fs::path(options_.dir) / checkpoint::step_dir_name(snapshot.state.global_step)).string();
  if (options_.background)
    writer_->save_async(std::move(snapshot));
  else
    writer_->save(std::move(snapshot));
  const auto t3 = Clock::now();
  // Training waited for the previous save, the snapshot and the write (a vote between the last
  // two is not the Checkpointer's).
  times_.previous_ms.push_back(pending_previous_ms_);
  times_.snapshot_ms.push_back(pending_snapshot_ms_);
  times_.write_ms.push_back(ms_between(t2, t3));
  times_.blocked_ms.push_back(pending_previous_ms_ + pending_snapshot_ms_ + ms_between(t2, t3));
}

void Checkpointer::discard() {
  pending_.reset();
  pending_shards_.reset();
}

void Checkpointer::wait() {
  if (writer_) writer_->wait();
}

bool Checkpointer::writing() const { return writer_ && writer_->writing(); }

void Checkpointer::record_step(double ms, bool while_writing) {
  if (!writer_) return;
  (while_writing ? times_.step_ms_while_writing : times_.step_ms_otherwise).push_back(ms);
}

std::string Checkpointer::summary() const {
  if (times_.blocked_ms.empty()) return "";
  return fmt::format(
      "checkpoint: {} save(s) to {} ({}): training waited {:.1f} ms per save (median; max {:.1f}; medians: {:.1f} "
      "for the previous save, {:.1f} snapshot, {:.1f} writing); {} step(s) ran while one was written, {:.2f} ms per "
      "step against {:.2f} ms otherwise (mean)",
      times_.blocked_ms.size(), options_.dir, options_.background ? "background writer" : "synchronous",
      median(times_.blocked_ms), *std::max_element(times_.blocked_ms.begin(), times_.blocked_ms.end()),
      median(times_.previous_ms), median(times_.snapshot_ms), median(times_.write_ms),
      times_.step_ms_while_writing.size(), mean(times_.step_ms_while_writing), mean(times_.step_ms_otherwise));
}

std::optional<Resumed> restore_newest(Communicator& control, const std::string& dir, Module& model,
                                      Optimizer& optimizer, const json& config, const PiecesFor& pieces_for,
                                      const StageOf& stage_of) {
  // What fails here is about the files (damaged, or made for another model or run): a restart
  // would fail the same way (core/exit_status.h). Failed MPI or CUDA calls keep their kind.
  return classify_errors(ErrorKind::kCheckpoint, [&] {
    return restore(control, [&] { return checkpoint::read_newest(dir); }, config, model, optimizer, pieces_for,
                   stage_of);
  });
}

std::optional<Resumed> restore_newest(Communicator& control, const std::string& dir, Module& model,
                                      Optimizer& optimizer, const json& config, const WantedPieces& pieces) {
  return restore_newest(control, dir, model, optimizer, config, [&](const Resumed&) { return pieces; });
}

Resumed restore_from(Communicator& control, const std::string& path, Module& model, Optimizer& optimizer,
                     const json& config, const PiecesFor& pieces_for, const StageOf& stage_of) {
  return classify_errors(ErrorKind::kCheckpoint, [&] {
    return *restore(
        control, [&] { return std::optional<checkpoint::LoadedCheckpoint>(checkpoint::read_checkpoint(path)); },
        config, model, optimizer, pieces_for, stage_of);
  });
}

Resumed restore_from(Communicator& control, const std::string& path, Module& model, Optimizer& optimizer,
                     const json& config, const WantedPieces& pieces) {
  return restore_from(control, path, model, optimizer, config, [&](const Resumed&) { return pieces; });
}

void load_initial_weights(Communicator& control, const std::string& path, Module& model) {
  const std::vector<std::string> parts = broadcast_from_root(
      control, [&]() -> std::vector<std::string> { return {as_string(safetensors::read_file(path).file_bytes())}; });
  agreed([&] { load_parameters(file_from(parts[0], path), model); });
}

void load_stage_weights(Communicator& control, const std::string& path, Module& stage,
                        std::span<const safetensors::TensorSpec> whole) {
  std::optional<safetensors::FileIndex> index;
  broadcast_from_root(control, [&]() -> std::vector<std::string> {
    index.emplace(path);
    safetensors::check_holds(index->header(), path, whole);
    return {};
  });
  // Each tensor checked as it is read, as load_parameters checks a whole file (refuse_nonfinite).
  receive_stage_tensors(control, stage, whole, path, [&](const std::string& name) {
    const safetensors::TensorInfo& info = index->at(name);
    const std::vector<std::byte> bytes = index->read(info);
    if (const checkpoint::NonfiniteValues bad = checkpoint::find_nonfinite(info.dtype, bytes); bad.count > 0)
      throw Error(fmt::format("{}: {}: {}", path, name, checkpoint::describe(bad)));
    return as_string(bytes);
  });
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
