// safetensors encoding and strict decoding. The parse trusts nothing in the file: every size is
// checked against the bytes actually present before it is used, so a lying header costs at most
// the file's own size in memory.
#include "checkpoint/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/durable_file.h"
#include "checkpoint/host_buffer_pool.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/temp_files.h"

namespace dtrain::safetensors {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

using nlohmann::json;

namespace {

constexpr std::pair<Dtype, std::string_view> kDtypeNames[] = {
    {Dtype::kBool, "BOOL"}, {Dtype::kU8, "U8"},   {Dtype::kI8, "I8"},   {Dtype::kI16, "I16"},
    {Dtype::kF16, "F16"},   {Dtype::kBF16, "BF16"}, {Dtype::kI32, "I32"}, {Dtype::kF32, "F32"},
    {Dtype::kI64, "I64"},   {Dtype::kF64, "F64"},
};

template <class T>
std::vector<size_t> order_of(std::span<const T> tensors) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (tensors[a].dtype != tensors[b].dtype) return tensors[a].dtype > tensors[b].dtype;
    return tensors[a].name < tensors[b].name;
  });
  return order;
}

// numel * element size, or nullopt on a negative dimension or overflow.
std::optional<uint64_t> checked_nbytes(const Shape& shape, Dtype dtype) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

[[noreturn]] void fail(std::string_view source, const std::string& problem) {
  throw Error(fmt::format("{}: {}", source, problem));
}

// The JSON parse, also rejecting a key repeated in one object (nlohmann keeps the last silently).
json parse_json(std::string_view text, std::string_view source) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto track = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == json::parse_event_t::key && !open_objects.empty() && duplicate.empty() &&
        !open_objects.back().insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  json doc;
  try {
    doc = json::parse(text.begin(), text.end(), track);
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (auto close = what.find("] "); what.starts_with("[json.exception") && close != std::string::npos)
      what.erase(0, close + 2);
    fail(source, "header is not valid JSON: " + what);
  }
  if (!duplicate.empty()) fail(source, fmt::format("header has the key '{}' twice", duplicate));
  return doc;
}

TensorInfo parse_tensor_entry(const std::string& name, const json& entry, std::string_view source) {
  if (!entry.is_object()) fail(source, fmt::format("header entry '{}' is not an object", name));
  for (const auto& [key, value] : entry.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail(source, fmt::format("tensor '{}' has an unknown field '{}'", name, key));
  TensorInfo info;
  info.name = name;
  auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) fail(source, fmt::format("tensor '{}' has no dtype string", name));
  auto parsed = parse_dtype(dtype->get<std::string>());
  if (!parsed) fail(source, fmt::format("tensor '{}' has unknown dtype '{}'", name, dtype->get<std::string>()));
  info.dtype = *parsed;
  auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) fail(source, fmt::format("tensor '{}' has no shape array", name));
  for (const json& d : *shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()})
      fail(source, fmt::format("tensor '{}' has shape {}, not a list of sizes", name, shape->dump()));
    info.shape.push_back(d.get<int64_t>());
  }
  auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    fail(source, fmt::format("tensor '{}' has no data_offsets [begin, end]", name));
  info.begin = (*offsets)[0].get<uint64_t>();
  info.end = (*offsets)[1].get<uint64_t>();
  return info;
}

// Each tensor's size agrees with its shape, and the offsets tile [0, data_bytes) exactly.
void check_layout(std::vector<TensorInfo> tensors, uint64_t data_bytes, std::string_view source) {
  for (const TensorInfo& t : tensors) {
    if (t.begin > t.end) fail(source, fmt::format("tensor '{}' has data_offsets [{}, {}], begin after end", t.name, t.begin, t.end));
    if (t.end > data_bytes)
      fail(source, fmt::format("tensor '{}' has data_offsets [{}, {}] beyond the {}-byte data buffer", t.name, t.begin,
                               t.end, data_bytes));
    auto nbytes = checked_nbytes(t.shape, t.dtype);
    if (!nbytes || *nbytes != t.end - t.begin)
      fail(source, fmt::format("tensor '{}' of dtype {} and shape {} needs {} bytes, its data_offsets [{}, {}] hold {}",
                               t.name, dtype_name(t.dtype), shape_str(t.shape),
                               nbytes ? fmt::to_string(*nbytes) : std::string("more than 2^64"), t.begin, t.end,
                               t.end - t.begin));
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : tensors) {
    if (t.begin < covered)
      fail(source, fmt::format("tensors '{}' and '{}' overlap (data_offsets [{}, {}] and [{}, {}])", previous->name,
                               t.name, previous->begin, previous->end, t.begin, t.end));
    if (t.begin > covered)
      fail(source, fmt::format("bytes [{}, {}) of the data buffer belong to no tensor (before '{}')", covered, t.begin,
                               t.name));
    covered = t.end;
    previous = &t;
  }
  if (covered != data_bytes)
    fail(source, fmt::format("{} trailing bytes after the last tensor (tensors end at {}, the data buffer has {})",
                             data_bytes - covered, covered, data_bytes));
}

}  // namespace

size_t dtype_size(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBool: case Dtype::kU8: case Dtype::kI8: return 1;
    case Dtype::kI16: case Dtype::kF16: case Dtype::kBF16: return 2;
    case Dtype::kI32: case Dtype::kF32: return 4;
    case Dtype::kI64: case Dtype::kF64: return 8;
  }
  return 0;
}

std::string_view dtype_name(Dtype dtype) {
  for (const auto& [d, name] : kDtypeNames)
    if (d == dtype) return name;
  return "?";
}

std::optional<Dtype> parse_dtype(std::string_view name) {
  for (const auto& [d, n] : kDtypeNames)
    if (n == name) return d;
  return std::nullopt;
}

Dtype from_core(DType dtype) {
  switch (dtype) {
    case DType::kF32: return Dtype::kF32;
    case DType::kI32: return Dtype::kI32;
    case DType::kBF16: return Dtype::kBF16;
    case DType::kF16: return Dtype::kF16;
    case DType::kU8: return Dtype::kU8;
    case DType::kI64: return Dtype::kI64;
  }
  throw Error("safetensors: unknown core dtype");
}

std::optional<DType> to_core(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32: return DType::kF32;
    case Dtype::kI32: return DType::kI32;
    case Dtype::kBF16: return DType::kBF16;
    case Dtype::kF16: return DType::kF16;
    case Dtype::kU8: return DType::kU8;
    case Dtype::kI64: return DType::kI64;
    default: return std::nullopt;
  }
}

namespace {

std::shared_ptr<std::byte> new_host_bytes(size_t n) {
  return std::shared_ptr<std::byte>(std::make_unique_for_overwrite<std::byte[]>(n).release(),
                                    std::default_delete<std::byte[]>());
}

}  // namespace

HostTensor host_copy(std::string name, const Tensor& t, checkpoint::HostBufferPool* pool) {
  DTRAIN_CHECK(t.defined(), "host_copy of the undefined tensor '{}'", name);
  std::shared_ptr<std::byte> bytes = pool ? pool->get(t.nbytes()) : new_host_bytes(t.nbytes());
  if (t.nbytes()) copy_bytes(bytes.get(), Device::cpu(), t.raw(), t.device(), t.nbytes());
  return {std::move(name), from_core(t.dtype()), t.shape(), std::move(bytes), t.nbytes()};
}

HostTensor adopt_host_tensor(std::string name, Tensor t) {
  DTRAIN_CHECK(t.defined() && t.device().is_cpu(), "adopt_host_tensor: '{}' is not a CPU tensor", name);
  auto owner = std::make_shared<Tensor>(std::move(t));
  const auto* bytes = static_cast<const std::byte*>(owner->raw());
  return {std::move(name), from_core(owner->dtype()), owner->shape(), std::shared_ptr<const std::byte>(owner, bytes),
          owner->nbytes()};
}

HostTensor i64_scalar(std::string name, int64_t value) {
  std::shared_ptr<std::byte> bytes = new_host_bytes(8);
  std::memcpy(bytes.get(), &value, 8);
  return {std::move(name), Dtype::kI64, {}, std::move(bytes), 8};
}

std::vector<TensorRef> refs(std::span<const HostTensor> tensors) {
  std::vector<TensorRef> out;
  out.reserve(tensors.size());
  for (const HostTensor& t : tensors) out.push_back(t.ref());
  return out;
}

// Data order: larger elements first (each tensor then starts aligned to its element size, the
// buffer itself starting 8-aligned), then by name.
std::vector<size_t> data_order(std::span<const TensorSpec> tensors) { return order_of(tensors); }

uint64_t nbytes_of(const TensorSpec& spec) {
  auto n = checked_nbytes(spec.shape, spec.dtype);
  DTRAIN_CHECK(n.has_value(), "tensor '{}' has an invalid shape {}", spec.name, shape_str(spec.shape));
  return *n;
}

std::string encode_header(std::span<const TensorSpec> tensors, const Metadata& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i : data_order(tensors)) {
    const TensorSpec& t = tensors[i];
    const uint64_t nbytes = nbytes_of(t);
    DTRAIN_CHECK(t.name != "__metadata__" && !header.contains(t.name), "tensor name '{}' used twice or reserved", t.name);
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    throw Error(fmt::format("safetensors: cannot encode the header: {}", e.what()));  // a name that is not UTF-8
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-aligned, as the reference pads
  return text;
}

std::string encode_header(std::span<const TensorRef> tensors, const Metadata& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const TensorRef& t : tensors) {
    auto nbytes = checked_nbytes(t.shape, t.dtype);
    DTRAIN_CHECK(nbytes && *nbytes == t.bytes.size(), "tensor '{}' of dtype {} and shape {} given {} bytes", t.name,
                 dtype_name(t.dtype), shape_str(t.shape), t.bytes.size());
    specs.push_back({t.name, t.dtype, t.shape});
  }
  return encode_header(std::span<const TensorSpec>(specs), metadata);
}

Header parse_header(std::string_view text, uint64_t data_bytes, std::string_view source) {
  if (text.empty() || text.front() != '{') fail(source, "header does not start with '{'");
  json doc = parse_json(text, source);
  if (!doc.is_object()) fail(source, "header is not a JSON object");
  Header header;
  for (const auto& [key, value] : doc.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail(source, "__metadata__ is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) fail(source, fmt::format("__metadata__ value of '{}' is not a string", mk));
        header.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    header.tensors.push_back(parse_tensor_entry(key, value, source));
  }
  check_layout(header.tensors, data_bytes, source);
  return header;  // json objects iterate in key order: tensors are sorted by name
}

namespace {

uint64_t write_encoded_header(ByteSink& sink, const std::string& header) {
  const uint64_t length = header.size();
  sink.write(std::as_bytes(std::span(&length, 1)));
  sink.write(std::as_bytes(std::span(header)));
  return 8 + length;
}

}  // namespace

uint64_t write_header(ByteSink& sink, std::span<const TensorSpec> tensors, const Metadata& metadata) {
  return write_encoded_header(sink, encode_header(tensors, metadata));
}

uint64_t write(ByteSink& sink, std::span<const TensorRef> tensors, const Metadata& metadata) {
  uint64_t total = write_encoded_header(sink, encode_header(tensors, metadata));
  for (size_t i : order_of(tensors)) {
    sink.write(tensors[i].bytes);
    total += tensors[i].bytes.size();
  }
  return total;
}

File::File(std::unique_ptr<std::byte[]> bytes, uint64_t size, std::string source)
    : bytes_(std::move(bytes)), size_(size), source_(std::move(source)) {
  if (size_ < 8) fail(source_, fmt::format("{} bytes, too short for the 8-byte header length", size_));
  uint64_t length = 0;
  std::memcpy(&length, bytes_.get(), 8);
  if (length > kMaxHeaderBytes) fail(source_, fmt::format("header length {} exceeds the limit of {} bytes", length, kMaxHeaderBytes));
  if (length > size_ - 8) fail(source_, fmt::format("header length {} exceeds the {} bytes after it", length, size_ - 8));
  data_start_ = 8 + length;
  const char* text = reinterpret_cast<const char*>(bytes_.get()) + 8;
  header_ = parse_header(std::string_view(text, length), size_ - data_start_, source_);
}

namespace {
const TensorInfo* find_in(const Header& header, std::string_view name) {
  auto it = std::lower_bound(header.tensors.begin(), header.tensors.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != header.tensors.end() && it->name == name ? &*it : nullptr;
}
}  // namespace

const TensorInfo* File::find(std::string_view name) const { return find_in(header_, name); }

const TensorInfo& File::at(std::string_view name) const {
  const TensorInfo* info = find(name);
  if (!info) fail(source_, fmt::format("no tensor '{}'", name));
  return *info;
}

std::span<const std::byte> File::bytes(const TensorInfo& info) const {
  return {bytes_.get() + data_start_ + info.begin, static_cast<size_t>(info.end - info.begin)};
}

void File::copy_to(std::string_view name, Tensor& dst) const {
  const TensorInfo& info = at(name);
  if (info.dtype != from_core(dst.dtype()))
    fail(source_, fmt::format("tensor '{}' has dtype {}, expected {}", name, dtype_name(info.dtype),
                              dtype_name(from_core(dst.dtype()))));
  if (info.shape != dst.shape())
    fail(source_, fmt::format("tensor '{}' has shape {}, expected {}", name, shape_str(info.shape), shape_str(dst.shape())));
  auto src = bytes(info);
  if (!src.empty()) copy_bytes(dst.raw(), dst.device(), src.data(), Device::cpu(), src.size());
}

Tensor File::to_tensor(std::string_view name) const {
  const TensorInfo& info = at(name);
  auto core = to_core(info.dtype);
  if (!core) fail(source_, fmt::format("tensor '{}' has dtype {}, which dtrain tensors do not hold", name, dtype_name(info.dtype)));
  Tensor t = Tensor::empty(info.shape, Device::cpu(), *core);
  copy_to(name, t);
  return t;
}

int64_t File::i64_scalar(std::string_view name) const {
  const TensorInfo& info = at(name);
  if (info.dtype != Dtype::kI64 || info.end - info.begin != 8)
    fail(source_, fmt::format("tensor '{}' is {} {}, expected one I64", name, dtype_name(info.dtype), shape_str(info.shape)));
  int64_t value = 0;
  std::memcpy(&value, bytes(info).data(), 8);
  return value;
}

File read_file(const std::string& path) {
  checkpoint::FileBytes file = checkpoint::read_whole_file(path);
  return File(std::move(file.data), file.size, path);
}

void write_file(const std::string& path, std::span<const TensorRef> tensors, const Metadata& metadata) {
  // Into a temporary name beside it, then renamed: a reader never sees a half-written file.
  remove_stale_temporaries(path);  // a killed writer's, never a live one's
  const std::string temp = temporary_path(path);
  {
    checkpoint::DurableFile file(temp, nullptr);
    write(file, tensors, metadata);
    file.commit();
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp.c_str());
    checkpoint::throw_os_error("cannot rename to", path, err);
  }
}

void check_holds(const Header& header, std::string_view source, std::span<const TensorSpec> expected) {
  std::set<std::string_view> wanted;
  for (const TensorSpec& t : expected) {
    const TensorInfo* info = find_in(header, t.name);
    if (!info) fail(source, fmt::format("no tensor '{}' (expected {} {})", t.name, dtype_name(t.dtype), shape_str(t.shape)));
    if (info->dtype != t.dtype || info->shape != t.shape)
      fail(source, fmt::format("tensor '{}' is {} {}, expected {} {}", t.name, dtype_name(info->dtype),
                               shape_str(info->shape), dtype_name(t.dtype), shape_str(t.shape)));
    wanted.insert(t.name);
  }
  for (const TensorInfo& info : header.tensors)
    if (!wanted.contains(info.name))
      fail(source, fmt::format("unexpected tensor '{}' ({} {})", info.name, dtype_name(info.dtype), shape_str(info.shape)));
}

void load_named(const File& file, std::span<const NamedTarget> targets) {
  std::vector<TensorSpec> expected;
  for (const NamedTarget& t : targets) expected.push_back({t.name, from_core(t.tensor->dtype()), t.tensor->shape()});
  check_holds(file.header(), file.source(), expected);
  for (const NamedTarget& t : targets) file.copy_to(t.name, *t.tensor);
}

FileIndex::FileIndex(const std::string& path) : source_(path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) checkpoint::throw_os_error("cannot open", path, errno);
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (size < 8) fail(source_, fmt::format("{} bytes, too short for the 8-byte header length", size));
  uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), 8);
  if (length > kMaxHeaderBytes) fail(source_, fmt::format("header length {} exceeds the limit of {} bytes", length, kMaxHeaderBytes));
  if (length > size - 8) fail(source_, fmt::format("header length {} exceeds the {} bytes after it", length, size - 8));
  std::string text(length, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(length))) fail(source_, "cannot read the header");
  data_start_ = 8 + length;
  header_ = parse_header(text, size - data_start_, source_);
}

const TensorInfo& FileIndex::at(std::string_view name) const {
  const TensorInfo* info = find_in(header_, name);
  if (!info) fail(source_, fmt::format("no tensor '{}'", name));
  return *info;
}

std::vector<std::byte> FileIndex::read(const TensorInfo& info) const {
  std::vector<std::byte> out(static_cast<size_t>(info.end - info.begin));
  std::ifstream in(source_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + info.begin));
  if (!in || !in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size())))
    fail(source_, fmt::format("cannot read tensor '{}' (the file changed while being read?)", info.name));
  return out;
}

}  // namespace dtrain::safetensors
