// .npy headers (a Python dict literal, parsed here, never evaluated), mapping .npy files, and
// finding the members of a .npz archive from its zip central directory.
#include "data/npy.h"

#include <libdeflate.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <new>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "data/mapped_data_file.h"

namespace dtrain {

static_assert(std::endian::native == std::endian::little, "NumPy arrays are read in place: little-endian hosts only");

namespace {

[[noreturn]] void bad_data(const std::string& message) { throw Error(message, ErrorKind::kData); }

// Largest array accepted (1 TiB): a shape beyond it is corrupt, not a data set.
constexpr int64_t kMaxArrayBytes = int64_t{1} << 40;

struct TypeInfo {
  NpyType type;
  char kind;  // descr's kind letter
  int size;
  const char* name;
};
constexpr TypeInfo kTypes[] = {
    {NpyType::kBool, 'b', 1, "bool"},    {NpyType::kI8, 'i', 1, "int8"},       {NpyType::kU8, 'u', 1, "uint8"},
    {NpyType::kI16, 'i', 2, "int16"},    {NpyType::kU16, 'u', 2, "uint16"},   {NpyType::kI32, 'i', 4, "int32"},
    {NpyType::kU32, 'u', 4, "uint32"},   {NpyType::kI64, 'i', 8, "int64"},    {NpyType::kU64, 'u', 8, "uint64"},
    {NpyType::kF16, 'f', 2, "float16"},  {NpyType::kF32, 'f', 4, "float32"},  {NpyType::kF64, 'f', 8, "float64"},
};

const TypeInfo& info(NpyType t) {
  for (const TypeInfo& i : kTypes)
    if (i.type == t) return i;
  return kTypes[0];
}

// Text from a file, fit for a one-line message: control and non-ASCII bytes as \xNN, trailing
// padding dropped, at most 120 characters.
std::string printable(std::string_view text) {
  while (!text.empty() && (text.back() == ' ' || text.back() == '\n')) text.remove_suffix(1);
  std::string out;
  for (char c : text.substr(0, 120)) {
    const auto u = static_cast<unsigned char>(c);
    out += u >= 0x20 && u < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", u);
  }
  return text.size() > 120 ? out + "..." : out;
}

// A dict literal's value, as far as a .npy header uses them.
struct Value {
  enum Kind { kString, kBool, kTuple, kOther } kind = kOther;
  std::string text;  // kString: the string; kOther: the literal as written
  bool flag = false;
  std::vector<int64_t> ints;
};

// Python's repr of a dict with string keys, strings, True/False and tuples of ints: what
// numpy's header writer emits (and hand-written headers of the same kind). Anything else is
// kept as text (kOther), so that a list descr (a structured dtype) is named, not misread.
class DictParser {
 public:
  DictParser(std::string_view text, const std::string& name) : s_(text), name_(name) {}

  std::map<std::string, Value> parse() {
    std::map<std::string, Value> out;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      if (peek() != '\'' && peek() != '"') fail("a quoted key");
      const std::string key = string_literal();
      expect(':');
      if (out.contains(key)) fail_text(fmt::format("key '{}' appears twice", printable(key)));
      out[key] = value();
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      if (peek() != '}') fail("',' or '}'");
    }
    ++at_;
    skip_space();
    if (at_ != s_.size()) fail("the end of the header after '}'");
    return out;
  }

 private:
  char peek() const { return at_ < s_.size() ? s_[at_] : '\0'; }
  void skip_space() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\n' || s_[at_] == '\t' || s_[at_] == '\r')) ++at_;
  }
  [[noreturn]] void fail_text(const std::string& what) const {
    bad_data(fmt::format("{}: header is not a dict literal: {} (header '{}')", name_, what, printable(s_)));
  }
  [[noreturn]] void fail(const char* expected) const {
    fail_text(fmt::format("expected {} at character {}", expected, at_));
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(c == '{' ? "'{'" : c == ':' ? "':'" : "a delimiter");
    ++at_;
  }
  std::string string_literal() {
    const char quote = s_[at_++];
    std::string out;
    while (at_ < s_.size() && s_[at_] != quote) {
      if (s_[at_] == '\\') fail_text("escapes in strings are not supported");
      out += s_[at_++];
    }
    if (at_ == s_.size()) fail("a closing quote");
    ++at_;
    return out;
  }
  int64_t integer() {
    const size_t start = at_;
    int64_t v = 0;
    while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') {
      if (v > (kMaxArrayBytes - 9) / 10) fail_text("a dimension is implausibly large");
      v = v * 10 + (s_[at_++] - '0');
    }
    if (at_ == start) fail("a non-negative integer");
    if (peek() == 'L') ++at_;  // Python 2's long literal, in files written by old numpy
    return v;
  }
  Value value() {
    skip_space();
    Value v;
    const char c = peek();
    if (c == '\'' || c == '"') {
      v.kind = Value::kString;
      v.text = string_literal();
    } else if (s_.substr(at_).starts_with("True") || s_.substr(at_).starts_with("False")) {
      v.kind = Value::kBool;
      v.flag = s_[at_] == 'T';
      at_ += v.flag ? 4 : 5;
    } else if (c == '(') {
      v.kind = Value::kTuple;
      ++at_;
      while (true) {
        skip_space();
        if (peek() == ')') break;
        v.ints.push_back(integer());
        skip_space();
        if (peek() == ',') {
          ++at_;
        } else if (peek() != ')') {
          fail("',' or ')' in the shape");
        }
      }
      ++at_;
    } else {
      // Anything else up to the next top-level ',' or '}' (a list, a number, None): kept as text.
      const size_t start = at_;
      int depth = 0;
      while (at_ < s_.size() && (depth > 0 || (s_[at_] != ',' && s_[at_] != '}'))) {
        if (s_[at_] == '[' || s_[at_] == '(' || s_[at_] == '{') ++depth;
        if (s_[at_] == ']' || s_[at_] == ')' || s_[at_] == '}') --depth;
        ++at_;
      }
      if (at_ == start) fail("a value");
      v.text = std::string(s_.substr(start, at_ - start));
    }
    return v;
  }

  std::string_view s_;
  const std::string& name_;
  size_t at_ = 0;
};

// The dtype a descr names, or one line saying why it is not supported.
NpyType parse_descr(const Value& v, const std::string& name) {
  if (v.kind != Value::kString)
    bad_data(fmt::format("{}: header field 'descr' is {}: structured dtypes are not supported (a plain numeric array "
                         "is)",
                         name, v.text.empty() ? "not a string" : printable(v.text)));
  const std::string d = printable(v.text);
  if (d.size() >= 2 && d[1] == 'O')
    bad_data(fmt::format("{}: header field 'descr' is '{}': an object array (pickled Python objects) is not supported; "
                         "save a numeric array",
                         name, d));
  if (d.size() >= 2 && d[0] == '>' && d != ">u1" && d != ">i1" && d != ">b1")
    bad_data(fmt::format("{}: header field 'descr' is '{}': big-endian data is not supported (save "
                         "x.astype(x.dtype.newbyteorder('<')))",
                         name, d));
  if (d.size() >= 3 && (d[0] == '<' || d[0] == '|' || d[0] == '=' || d[0] == '>')) {
    int size = 0;
    const std::string digits = d.substr(2);
    if (digits.size() == 1 && digits[0] >= '1' && digits[0] <= '8') size = digits[0] - '0';
    for (const TypeInfo& t : kTypes)
      if (t.kind == d[1] && t.size == size) return t.type;
  }
  bad_data(fmt::format("{}: header field 'descr' is '{}': not a supported dtype (bool, integers, float16/32/64)", name,
                       d));
}

uint16_t u16_at(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t u32_at(const uint8_t* p) { return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24; }
uint64_t u64_at(const uint8_t* p) { return uint64_t{u32_at(p)} | uint64_t{u32_at(p + 4)} << 32; }

std::string shape_text(const std::vector<int64_t>& shape) {
  return shape.size() == 1 ? fmt::format("({},)", shape[0]) : fmt::format("({})", fmt::join(shape, ", "));
}

}  // namespace

const char* npy_type_name(NpyType type) { return info(type).name; }
int npy_type_size(NpyType type) { return info(type).size; }
bool npy_type_is_integer(NpyType type) { return info(type).kind == 'i' || info(type).kind == 'u'; }

int64_t NpyHeader::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

NpyHeader parse_npy(std::span<const uint8_t> bytes, const std::string& name) {
  static constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.size() < 6 || std::memcmp(bytes.data(), kMagic, 6) != 0)
    bad_data(fmt::format("{}: not a .npy file (bad magic: expected \\x93NUMPY)", name));
  if (bytes.size() < 10)  // a .npy cut inside its prefix: its magic is right, so not "bad magic"
    bad_data(fmt::format("{}: truncated: {} bytes, shorter than a .npy header's prefix", name, bytes.size()));
  const int major = bytes[6], minor = bytes[7];
  if (major < 1 || major > 3 || minor != 0)
    bad_data(fmt::format("{}: .npy format version {}.{} is not supported (1.0, 2.0 or 3.0)", name, major, minor));
  const size_t prefix = major == 1 ? 10 : 12;
  if (bytes.size() < prefix) bad_data(fmt::format("{}: truncated in the header length", name));
  const size_t header_len = major == 1 ? u16_at(bytes.data() + 8) : u32_at(bytes.data() + 8);
  if (bytes.size() - prefix < header_len)
    bad_data(fmt::format("{}: header length {} runs past the end of the file ({} bytes)", name, header_len,
                         bytes.size()));
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + prefix), header_len);
  std::map<std::string, Value> dict = DictParser(text, name).parse();
  for (const char* key : {"descr", "fortran_order", "shape"})
    if (!dict.contains(key)) bad_data(fmt::format("{}: header has no field '{}'", name, key));
  if (dict.size() != 3) {
    for (const auto& [key, v] : dict)
      if (key != "descr" && key != "fortran_order" && key != "shape")
        bad_data(fmt::format("{}: header has an unexpected field '{}' (only descr, fortran_order and shape)", name,
                             printable(key)));
  }
  NpyHeader h;
  h.type = parse_descr(dict["descr"], name);
  const Value& order = dict["fortran_order"];
  if (order.kind != Value::kBool)
    bad_data(fmt::format("{}: header field 'fortran_order' is not True or False", name));
  if (order.flag)
    bad_data(fmt::format("{}: header field 'fortran_order' is True: only C-order arrays are supported (save "
                         "np.ascontiguousarray(x))",
                         name));
  const Value& shape = dict["shape"];
  if (shape.kind != Value::kTuple) bad_data(fmt::format("{}: header field 'shape' is not a tuple of integers", name));
  h.shape = shape.ints;
  int64_t bytes_needed = npy_type_size(h.type);
  for (int64_t d : h.shape) {
    if (d != 0 && bytes_needed > kMaxArrayBytes / d)
      bad_data(fmt::format("{}: header field 'shape' {} is implausibly large", name, shape_text(h.shape)));
    bytes_needed *= d;
  }
  h.data_offset = prefix + header_len;
  const size_t have = bytes.size() - h.data_offset;
  if (static_cast<size_t>(bytes_needed) != have)
    bad_data(fmt::format("{}: header field 'shape' {} of {} makes {} bytes, but {} bytes follow the header", name,
                         shape_text(h.shape), npy_type_name(h.type), bytes_needed, have));
  return h;
}

NpyArray open_npy(const std::string& path) {
  auto map = std::make_shared<const MappedDataFile>(path);
  const NpyHeader h = parse_npy(map->bytes(), path);
  return NpyArray(path, h, map->bytes().data() + h.data_offset, map);
}

// Note [NumPy archives]
// A .npz is a zip archive (np.savez: members stored; np.savez_compressed: deflated), each
// member "<name>.npy". The central directory at the end says where each member is and how big;
// ZIP64 records (numpy writes members with force_zip64) carry the sizes and offsets that do not
// fit 32 bits. A stored member is mapped where it lies, so its array is at an arbitrary offset:
// NpyArray::data() is read with memcpy. A deflated member is inflated whole into memory by
// libdeflate, already a dependency for gzip (no zip library needed for two cases this simple);
// its CRC-32 is checked, and so is a stored member's (one pass at open, as token shards are
// checked whole). Encryption, other compression methods and multi-disk archives are refused.
namespace {

struct ZipMember {
  std::string name;
  uint16_t flags = 0, method = 0;
  uint32_t crc = 0;
  uint64_t compressed = 0, size = 0, local_offset = 0;
};

// The central directory of `zip`; throws naming `path` when it is not a zip archive.
std::vector<ZipMember> central_directory(std::span<const uint8_t> zip, const std::string& path) {
  const auto not_zip = [&](const std::string& why) {
    bad_data(fmt::format("{}: not a .npz (zip) archive: {}", path, why));
  };
  if (zip.size() < 22) not_zip("too short");
  // The end-of-central-directory record: the last "PK\5\6" within the final 64 KiB + 22 bytes.
  size_t eocd = zip.size() - 22;
  const size_t lowest = zip.size() > 65557 ? zip.size() - 65557 : 0;
  while (u32_at(zip.data() + eocd) != 0x06054b50) {
    if (eocd == lowest) not_zip("no end-of-central-directory record");
    --eocd;
  }
  const uint8_t* e = zip.data() + eocd;
  uint64_t entries = u16_at(e + 10), cd_size = u32_at(e + 12), cd_offset = u32_at(e + 16);
  if (u16_at(e + 4) != 0 || u16_at(e + 6) != 0) not_zip("a multi-disk archive");
  if (entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
    // ZIP64: its locator sits just before the record and points to the ZIP64 record.
    if (eocd < 20 || u32_at(e - 20) != 0x07064b50) not_zip("no ZIP64 locator");
    const uint64_t z = u64_at(e - 20 + 8);
    if (zip.size() < 56 || z > zip.size() - 56 || u32_at(zip.data() + z) != 0x06064b50) not_zip("a bad ZIP64 record");
    entries = u64_at(zip.data() + z + 32);
    cd_size = u64_at(zip.data() + z + 40);
    cd_offset = u64_at(zip.data() + z + 48);
  }
  if (cd_offset > zip.size() || cd_size > zip.size() - cd_offset) not_zip("the central directory lies outside it");
  std::vector<ZipMember> out;
  size_t at = cd_offset;
  const size_t end = cd_offset + cd_size;
  for (uint64_t i = 0; i < entries; ++i) {
    if (at + 46 > end || u32_at(zip.data() + at) != 0x02014b50) not_zip("a damaged central directory");
    const uint8_t* c = zip.data() + at;
    ZipMember m;
    m.flags = u16_at(c + 8);
    m.method = u16_at(c + 10);
    m.crc = u32_at(c + 16);
    m.compressed = u32_at(c + 20);
    m.size = u32_at(c + 24);
    const size_t name_len = u16_at(c + 28), extra_len = u16_at(c + 30), comment_len = u16_at(c + 32);
    m.local_offset = u32_at(c + 42);
    if (at + 46 + name_len + extra_len + comment_len > end) not_zip("a damaged central directory");
    m.name = printable(std::string_view(reinterpret_cast<const char*>(c + 46), name_len));
    // The ZIP64 extra field: the 64-bit values of those that read 0xFFFFFFFF, in this order.
    for (size_t x = 46 + name_len; x + 4 <= 46 + name_len + extra_len;) {
      const uint16_t id = u16_at(c + x), len = u16_at(c + x + 2);
      if (x + 4 + len > 46 + name_len + extra_len) not_zip(fmt::format("member {}: a damaged extra field", m.name));
      if (id == 0x0001) {
        size_t f = x + 4;
        for (uint64_t* field : {&m.size, &m.compressed, &m.local_offset}) {
          if (*field != 0xFFFFFFFF) continue;
          if (f + 8 > x + 4 + len) not_zip(fmt::format("member {}: a short ZIP64 extra field", m.name));
          *field = u64_at(c + f);
          f += 8;
        }
      }
      x += 4 + len;
    }
    out.push_back(std::move(m));
    at += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

// The bytes of `m` in `zip`, checked: mapped in place when stored, inflated into `inflated` when
// deflated; the CRC-32 either way.
// Inflated bytes, allocated without being zero-filled: a damaged directory that claims a huge
// size costs address space, not memory, since the inflater writes only what the stream holds.
struct InflatedBytes {
  std::unique_ptr<uint8_t[]> data;
  size_t size = 0;
};

std::span<const uint8_t> member_bytes(std::span<const uint8_t> zip, const ZipMember& m, const std::string& name,
                                      InflatedBytes& inflated) {
  if (m.flags & 1) bad_data(fmt::format("{}: the member is encrypted", name));
  if (m.method != 0 && m.method != 8)
    bad_data(fmt::format("{}: compression method {} is not supported (np.savez stores, np.savez_compressed "
                         "deflates; both are read)",
                         name, m.method));
  const size_t lh = m.local_offset;
  if (lh > zip.size() || zip.size() - lh < 30 || u32_at(zip.data() + lh) != 0x04034b50)
    bad_data(fmt::format("{}: damaged archive: no local header at offset {}", name, lh));
  const size_t start = lh + 30 + u16_at(zip.data() + lh + 26) + u16_at(zip.data() + lh + 28);
  if (start > zip.size() || m.compressed > zip.size() - start)
    bad_data(fmt::format("{}: damaged archive: the member's {} bytes run past the end of the file", name,
                         m.compressed));
  std::span<const uint8_t> out = zip.subspan(start, m.compressed);
  if (m.method == 8) {
    // Deflate expands at most 1032:1: a larger size is a damaged directory, not a real member.
    if (m.size / 1032 > m.compressed + 1)
      bad_data(fmt::format("{}: damaged archive: {} bytes cannot inflate to {}", name, m.compressed, m.size));
    try {
      inflated.data = std::make_unique_for_overwrite<uint8_t[]>(m.size);
      inflated.size = m.size;
    } catch (const std::bad_alloc&) {
      throw Error(fmt::format("{}: out of memory inflating its {} bytes", name, m.size), ErrorKind::kResources);
    }
    std::unique_ptr<libdeflate_decompressor, decltype(&libdeflate_free_decompressor)> d(
        libdeflate_alloc_decompressor(), &libdeflate_free_decompressor);
    if (!d) throw Error(fmt::format("{}: out of memory", name), ErrorKind::kResources);
    if (libdeflate_deflate_decompress(d.get(), out.data(), out.size(), inflated.data.get(), inflated.size, nullptr) !=
        LIBDEFLATE_SUCCESS)
      bad_data(fmt::format("{}: damaged archive: the deflated member does not inflate to its {} bytes", name, m.size));
    out = std::span<const uint8_t>(inflated.data.get(), inflated.size);
  } else if (m.size != m.compressed) {
    bad_data(fmt::format("{}: damaged archive: a stored member of {} bytes says it holds {}", name, m.compressed,
                         m.size));
  }
  const uint32_t crc = static_cast<uint32_t>(libdeflate_crc32(0, out.data(), out.size()));
  if (crc != m.crc)
    bad_data(fmt::format("{}: damaged archive: CRC-32 {:08x}, the directory says {:08x}", name, crc, m.crc));
  return out;
}

}  // namespace

std::vector<NpyArray> open_npz(const std::string& path, const std::vector<std::string>& names) {
  auto map = std::make_shared<const MappedDataFile>(path);
  const std::vector<ZipMember> members = central_directory(map->bytes(), path);
  std::vector<NpyArray> out;
  for (const std::string& want : names) {
    const std::string name = fmt::format("{}: {}", path, want);
    const auto it = std::find_if(members.begin(), members.end(),
                                 [&](const ZipMember& m) { return m.name == want + ".npy"; });
    if (it == members.end()) {
      std::vector<std::string> have;
      for (const ZipMember& m : members) have.push_back(m.name.ends_with(".npy") ? m.name.substr(0, m.name.size() - 4) : m.name);
      bad_data(fmt::format("{}: no array '{}' (the archive holds: {}; save with np.savez(path, x=..., y=...))", path,
                           want, have.empty() ? "nothing" : fmt::format("{}", fmt::join(have, ", "))));
    }
    auto inflated = std::make_shared<InflatedBytes>();
    const std::span<const uint8_t> bytes = member_bytes(map->bytes(), *it, name, *inflated);
    const NpyHeader h = parse_npy(bytes, name);
    std::shared_ptr<const void> owner = inflated->data ? std::shared_ptr<const void>(inflated) : map;
    out.emplace_back(name, h, bytes.data() + h.data_offset, std::move(owner));
  }
  return out;
}

std::vector<uint8_t> npy_bytes(const std::string& descr, const std::vector<int64_t>& shape,
                               std::span<const uint8_t> data) {
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shape_text(shape));
  // numpy pads with spaces to a multiple of 64 bytes in all, ending in a newline.
  const size_t total = (10 + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - 10 - dict.size() - 1, ' ');
  dict += '\n';
  std::vector<uint8_t> out(10 + dict.size() + data.size());
  const uint8_t prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(dict.size() & 0xff),
                              static_cast<uint8_t>(dict.size() >> 8)};
  std::memcpy(out.data(), prefix, 10);
  std::memcpy(out.data() + 10, dict.data(), dict.size());
  if (!data.empty()) std::memcpy(out.data() + 10 + dict.size(), data.data(), data.size());
  return out;
}

}  // namespace dtrain
