#include "train/optimizer_transfer.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/durable_file.h"
#include "checkpoint/finite.h"
#include "comm/exchange.h"
#include "core/memory.h"
#include "train/root_broadcast.h"

namespace dtrain {

using checkpoint::Piece;
using nlohmann::json;

bool agree_sharded(Communicator& control, const OptimizerState& state) {
  // What this rank holds, not the values: replicas hold the same entries.
  const bool sliced = std::any_of(state.tensors.begin(), state.tensors.end(), [](const auto& e) { return e.is_slice(); });
  std::string layout = sliced ? "S" : "W";
  for (const OptimizerState::Entry& e : state.tensors)
    layout += fmt::format("{}:{}:{};", e.name, e.offset, e.value.numel());
  for (const OptimizerState::Count& c : state.counts) layout += c.name + ";";
  const std::vector<std::string> all = allgather_strings(control, layout);
  return std::any_of(all.begin(), all.end(), [&](const std::string& l) { return l != all.front() || l[0] == 'S'; });
}

checkpoint::ShardManifest shard_manifest(const OptimizerState& state, const safetensors::Metadata& metadata) {
  checkpoint::ShardManifest m;
  m.metadata = metadata;
  for (const OptimizerState::Entry& e : state.tensors) {
    DTRAIN_CHECK(!metadata.contains(e.name), "optimizer state '{}' has the name of a metadata entry", e.name);
    if (e.is_slice()) {
      DTRAIN_CHECK(e.value.shape().size() == 1, "optimizer state '{}': a slice is 1-D, got {}", e.name,
                   shape_str(e.value.shape()));
      m.tensors.push_back({{e.name, e.offset, e.value.numel(), e.full_shape}, safetensors::from_core(e.value.dtype()),
                           e.value.shape()});
    } else {
      m.tensors.push_back({{e.name, 0, e.value.numel(), e.value.shape()}, safetensors::from_core(e.value.dtype()),
                           e.value.shape()});
    }
  }
  for (const OptimizerState::Count& c : state.counts) m.counts.push_back({c.name, c.value});
  return m;
}

namespace {

// Elements per chunk of a tensor whose elements are `element` bytes: at least one.
int64_t chunk_elements(size_t chunk_bytes, size_t element) {
  return std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes / element));
}

void count(TransferStats* stats, size_t bytes) {
  if (!stats) return;
  stats->bytes += bytes;
  stats->chunks += 1;
  stats->largest_chunk = std::max(stats->largest_chunk, bytes);
}

// Rank 0's failure during a stream: every rank keeps moving chunks (so none waits on another),
// then this makes it every rank's error.
void agree_on(Communicator& control, const std::string& error) {
  broadcast_from_root(control, [&]() -> std::vector<std::string> {
    if (!error.empty()) throw Error(error, ErrorKind::kCheckpoint);
    return {};
  });
}

// Rank 0's file during a stream: only rank 0 writes, and a failure stops its writing (the file,
// uncommitted, is removed), not the stream; `error` keeps the first failure for agree_on.
class RootFile {
 public:
  RootFile(bool root, std::string& error) : root_(root), error_(error) {}
  template <class Write>
  void operator()(Write&& write) {
    if (!root_ || !error_.empty()) return;
    try {
      write(file_);
    } catch (const Error& e) {
      error_ = e.what();
      file_.reset();
    }
  }

 private:
  bool root_;
  std::string& error_;
  std::unique_ptr<checkpoint::DurableFile> file_;
};

// Moves `total` bytes of `value` (rank `owner`'s tensor; unread elsewhere) to rank 0 in chunks
// of at most `chunk_bytes` (whole elements of `element` bytes), each written to `file` there.
void stream_to_root(Communicator& control, int owner, const Tensor* value, uint64_t total, size_t element,
                    size_t chunk_bytes, std::vector<std::byte>& chunk, RootFile& file, TransferStats* stats) {
  const uint64_t step = static_cast<uint64_t>(chunk_elements(chunk_bytes, element)) * element;
  chunk.resize(std::max<size_t>(chunk.size(), static_cast<size_t>(std::min(step, total))));
  for (uint64_t at = 0; at < total; at += step) {
    const size_t len = static_cast<size_t>(std::min(step, total - at));
    if (owner == control.rank())
      copy_bytes(chunk.data(), Device::cpu(), static_cast<const std::byte*>(value->raw()) + at, value->device(), len);
    if (owner != 0) {  // rank 0's own bytes need not move
      control.broadcast(chunk.data(), static_cast<int64_t>(len), DType::kU8, owner);
      count(stats, len);
    }
    file([&](auto& f) { f->write({chunk.data(), len}); });
  }
}

}  // namespace

std::string first_nonfinite_slice(const OptimizerState& state, const std::string& file, size_t chunk_bytes) {
  std::vector<std::byte> chunk;
  for (const OptimizerState::Entry& e : state.tensors) {
    const size_t element = dtype_size(e.value.dtype());
    const int64_t step = chunk_elements(chunk_bytes, element);
    for (int64_t at = 0; at < e.value.numel(); at += step) {
      const int64_t n = std::min(step, e.value.numel() - at);
      chunk.resize(static_cast<size_t>(n) * element);
      copy_bytes(chunk.data(), Device::cpu(), static_cast<const std::byte*>(e.value.raw()) + at * element,
                 e.value.device(), chunk.size());
      checkpoint::NonfiniteValues v = checkpoint::find_nonfinite(safetensors::from_core(e.value.dtype()), chunk);
      if (v.count == 0) continue;
      v.first_index += at;  // the first one only: the rest of the tensor is not read
      return fmt::format("{}: {}: {}", file, e.name, checkpoint::describe(v));
    }
  }
  return "";
}

void send_optimizer_shards(Communicator& control, const OptimizerState& state, const safetensors::Metadata& metadata,
                           checkpoint::ShardedSave* save, size_t chunk_bytes, TransferStats* stats) {
  const int me = control.rank(), n = control.size();
  DTRAIN_CHECK((me == 0) == (save != nullptr), "rank {} {} the sharded save", me, save ? "holds" : "lacks");
  const checkpoint::ShardManifest mine = shard_manifest(state, metadata);
  std::string error;  // rank 0's first failure to write
  std::vector<std::byte> chunk;  // grown to the largest chunk needed, at most chunk_bytes
  for (int r = 0; r < n; ++r) {
    // Every rank learns rank r's sizes (each takes part in moving its chunks), rank 0 its header.
    const std::string encoded = n > 1 ? broadcast_string(control, r == me ? mine.encode() : "", r) : "";
    const checkpoint::ShardManifest m = r == me ? mine : checkpoint::ShardManifest::decode(encoded);
    const std::string name = checkpoint::optimizer_shard_name(r, n);
    RootFile file(me == 0, error);
    const std::vector<safetensors::TensorSpec> specs = m.specs();
    file([&](auto& f) {
      f = save->create(name);
      safetensors::write_header(*f, specs, m.file_metadata());
    });
    for (size_t i : safetensors::data_order(specs)) {
      if (i >= m.tensors.size()) {  // a count: rank 0 has its value from the manifest
        const int64_t value = m.counts[i - m.tensors.size()].value;
        file([&](auto& f) { f->write(std::as_bytes(std::span(&value, 1))); });
        continue;
      }
      stream_to_root(control, r, r == me ? &state.tensors[i].value : nullptr, safetensors::nbytes_of(specs[i]),
                     safetensors::dtype_size(specs[i].dtype), chunk_bytes, chunk, file, stats);
    }
    file([&](auto& f) {
      f->commit();
      save->add(name, *f);
    });
  }
  agree_on(control, error);
}

void send_stage_model(Communicator& control, const OptimizerState& mine, std::span<const safetensors::TensorSpec> whole,
                      const safetensors::Metadata& metadata, const std::string& file_name,
                      checkpoint::ShardedSave* save, size_t chunk_bytes) {
  const int me = control.rank();
  DTRAIN_CHECK((me == 0) == (save != nullptr), "rank {} {} the sharded save", me, save ? "holds" : "lacks");
  // Who holds what: every rank learns every rank's names (the same answer everywhere).
  std::string names;
  for (const OptimizerState::Entry& e : mine.tensors) names += e.name + "\n";
  const std::vector<std::string> held = allgather_strings(control, names);
  std::map<std::string, std::pair<int, const Tensor*>> owner;  // name -> lowest rank, its tensor here
  for (int r = static_cast<int>(held.size()) - 1; r >= 0; --r)
    for (size_t at = 0, nl; (nl = held[static_cast<size_t>(r)].find('\n', at)) != std::string::npos; at = nl + 1)
      owner[held[static_cast<size_t>(r)].substr(at, nl - at)] = {r, nullptr};
  for (const OptimizerState::Entry& e : mine.tensors)
    if (owner[e.name].first == me) owner[e.name].second = &e.value;
  std::string error;  // rank 0's first failure to write
  RootFile file(me == 0, error);
  file([&](auto& f) {
    f = save->create(file_name);
    safetensors::write_header(*f, whole, metadata);
  });
  std::vector<std::byte> chunk;
  for (size_t i : safetensors::data_order(whole)) {
    const auto it = owner.find(whole[i].name);
    DTRAIN_CHECK(it != owner.end(), "no stage holds '{}'", whole[i].name);
    const auto [r, value] = it->second;
    const uint64_t total = safetensors::nbytes_of(whole[i]);
    DTRAIN_CHECK(r != me || static_cast<uint64_t>(value->nbytes()) == total, "'{}': {} bytes, the whole model's {}",
                 whole[i].name, value->nbytes(), total);
    stream_to_root(control, r, value, total, safetensors::dtype_size(whole[i].dtype), chunk_bytes, chunk, file, nullptr);
  }
  file([&](auto& f) {
    f->commit();
    save->add(file_name, *f);
  });
  agree_on(control, error);
}

namespace {

// One range of one tensor that rank 0 sends to the ranks that asked for it.
struct Transfer {
  std::string name;
  int64_t offset = 0, numel = 0;
  bool whole = false;  // received in the tensor's own shape, not as a 1-D slice
  std::vector<int> receivers;
};

json encode_wanted(const WantedPieces& wanted) {
  if (!wanted) return nullptr;
  json out = json::array();
  for (const Piece& p : *wanted) out.push_back({p.name, p.offset, p.numel, p.full_shape});
  return out;
}

// Rank 0: what each rank asked for, against the checkpoint's tensors (same full shape, in range);
// identical requests of several ranks become one transfer (every rank of a run without ZeRO
// wants every tensor whole).
std::vector<Transfer> plan_transfers(const checkpoint::OptimizerFiles& files, const std::vector<std::string>& requests) {
  std::vector<Transfer> plan;
  std::map<std::tuple<std::string, int64_t, int64_t, bool>, size_t> index;
  auto add = [&](int rank, const std::string& name, int64_t offset, int64_t numel, bool whole) {
    auto [it, fresh] = index.try_emplace({name, offset, numel, whole}, plan.size());
    if (fresh) plan.push_back({name, offset, numel, whole, {}});
    plan[it->second].receivers.push_back(rank);
  };
  for (size_t r = 0; r < requests.size(); ++r) {
    const json wanted = json::parse(requests[r]);
    if (wanted.is_null()) {
      for (const checkpoint::StoredTensor& t : files.tensors()) add(static_cast<int>(r), t.name, 0, t.numel(), true);
      continue;
    }
    for (const json& w : wanted) {
      const Piece p{w.at(0).get<std::string>(), w.at(1).get<int64_t>(), w.at(2).get<int64_t>(), w.at(3).get<Shape>()};
      const checkpoint::StoredTensor* t = files.find(p.name);
      if (!t) continue;  // not updated yet when saved: starts fresh
      const std::string& source = files.sources()[static_cast<size_t>(t->pieces.empty() ? 0 : t->pieces.front().file)];
      if (t->full_shape != p.full_shape || p.offset < 0 || p.numel < 0 || p.offset + p.numel > t->numel())
        throw Error(fmt::format("{}: tensor '{}' is {}, rank {}'s optimizer wants elements [{}, {}) of a {}", source,
                                p.name, shape_str(t->full_shape), r, p.offset, p.offset + p.numel,
                                shape_str(p.full_shape)));
      add(static_cast<int>(r), p.name, p.offset, p.numel, false);
    }
  }
  for (const Transfer& x : plan)
    if (const auto* t = files.find(x.name); !safetensors::to_core(t->dtype))
      throw Error(fmt::format("{}: tensor '{}' has dtype {}, which dtrain tensors do not hold",
                              files.sources()[static_cast<size_t>(t->pieces.front().file)], x.name,
                              safetensors::dtype_name(t->dtype)));
  return plan;
}

json encode_plan(const checkpoint::OptimizerFiles& files, const std::vector<Transfer>& plan) {
  json transfers = json::array();
  for (const Transfer& x : plan) {
    const checkpoint::StoredTensor& t = *files.find(x.name);
    transfers.push_back({x.name, x.offset, x.numel, x.whole, x.receivers, safetensors::dtype_name(t.dtype), t.full_shape});
  }
  json counts = json::array();
  for (const checkpoint::ShardCount& c : files.counts()) counts.push_back({c.name, c.value});
  return {{"transfers", transfers}, {"counts", counts}};
}

}  // namespace

std::vector<checkpoint::Piece> wanted_pieces(const Optimizer& optimizer) {
  std::vector<checkpoint::Piece> pieces;
  const std::vector<const char*> keys = optimizer.state_keys();
  for (const Optimizer::OwnedPart& part : optimizer.owned_parts())
    for (const char* key : keys)
      pieces.push_back({part.param->name + "." + key, part.offset, part.count, part.param->value.shape()});
  return pieces;
}

OptimizerState receive_optimizer_state(Communicator& control, const checkpoint::OptimizerFiles* files,
                                       const WantedPieces& wanted, size_t chunk_bytes, TransferStats* stats) {
  const int me = control.rank();
  DTRAIN_CHECK((me == 0) == (files != nullptr), "rank {} {} the optimizer files", me, files ? "holds" : "lacks");
  const std::vector<std::string> requests = allgather_strings(control, encode_wanted(wanted).dump());
  const json plan = json::parse(broadcast_from_root(control, [&]() -> std::vector<std::string> {
                                  return {encode_plan(*files, plan_transfers(*files, requests)).dump()};
                                }).at(0));
  OptimizerState out;
  std::string error;  // rank 0's first failure to read
  std::vector<std::byte> chunk;
  for (const json& x : plan.at("transfers")) {
    const auto name = x.at(0).get<std::string>();
    const auto offset = x.at(1).get<int64_t>(), numel = x.at(2).get<int64_t>();
    const bool whole = x.at(3).get<bool>();
    const auto receivers = x.at(4).get<std::vector<int>>();
    const DType dtype = *safetensors::to_core(*safetensors::parse_dtype(x.at(5).get<std::string>()));
    const auto full_shape = x.at(6).get<Shape>();
    const bool mine = std::find(receivers.begin(), receivers.end(), me) != receivers.end();
    const bool others = std::any_of(receivers.begin(), receivers.end(), [](int r) { return r != 0; });
    Tensor value;
    if (mine) value = Tensor::empty(whole ? full_shape : Shape{numel}, Device::cpu(), dtype);
    const size_t element = dtype_size(dtype);
    const int64_t step = chunk_elements(chunk_bytes, element);
    chunk.resize(std::max(chunk.size(), static_cast<size_t>(std::min(step, numel)) * element));
    for (int64_t at = 0; at < numel; at += step) {
      const int64_t n = std::min(step, numel - at);
      const size_t len = static_cast<size_t>(n) * element;
      if (me == 0 && error.empty()) {
        try {
          files->read(*files->find(name), offset + at, n, chunk.data());
        } catch (const Error& e) {
          error = e.what();
        }
      }
      if (others) {  // chunks only rank 0 wants never leave it
        control.broadcast(chunk.data(), static_cast<int64_t>(len), DType::kU8, 0);
        count(stats, len);
      }
      if (mine) std::memcpy(static_cast<std::byte*>(value.raw()) + at * static_cast<int64_t>(element), chunk.data(), len);
    }
    if (!mine) continue;
    if (whole)
      out.tensors.push_back({name, std::move(value)});
    else
      out.tensors.push_back({name, std::move(value), offset, full_shape});
  }
  agree_on(control, error);
  // The parameters ("1.weight" of "1.weight.exp_avg") this rank got pieces of.
  auto parameter = [](const std::string& name) { return name.substr(0, name.rfind('.')); };
  std::set<std::string> got;
  for (const OptimizerState::Entry& e : out.tensors) got.insert(parameter(e.name));
  for (const json& c : plan.at("counts")) {
    const auto name = c.at(0).get<std::string>();
    if (!wanted || got.contains(parameter(name))) out.counts.push_back({name, c.at(1).get<int64_t>()});
  }
  return out;
}

}  // namespace dtrain
