// NumPy's array files: .npy (format versions 1.0, 2.0 and 3.0, numpy/lib/format.py) and the named
// arrays of a .npz archive (a zip of .npy files, np.savez / np.savez_compressed). Arrays are
// memory-mapped read-only (ranks of a node share the page cache, nothing is copied); a .npz
// member stored uncompressed (np.savez) is mapped in place, a deflated one (np.savez_compressed)
// is inflated into memory by libdeflate, its CRC-32 checked (Note [NumPy archives]).
//
// Every malformed file is one Error (kData) naming the file (and the archive member) and the
// field: bad magic, an unknown version, a header that is not a dict literal, a missing or extra
// key, a dtype that is not a little-endian number (object arrays, strings, structured dtypes,
// big-endian), fortran_order True, a shape that disagrees with the file's size.
// Little-endian hosts only (the numbers are read in place).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dtrain {

// The numeric dtypes a header may name ('|u1', '<i8', '<f4', ...).
enum class NpyType { kBool, kI8, kU8, kI16, kU16, kI32, kU32, kI64, kU64, kF16, kF32, kF64 };

const char* npy_type_name(NpyType type);  // "uint8", "float32", ...
int npy_type_size(NpyType type);          // bytes per element
bool npy_type_is_integer(NpyType type);   // kI8 .. kU64

// What a .npy header says.
struct NpyHeader {
  NpyType type = NpyType::kU8;
  std::vector<int64_t> shape;
  size_t data_offset = 0;  // where the array's bytes start: the magic, version, length and dict
  int64_t numel() const;
};

// Parses the header at the start of `bytes`, the whole .npy file (or archive member) named `name`
// in messages, and checks that the rest of `bytes` is exactly the array it describes. Pure.
NpyHeader parse_npy(std::span<const uint8_t> bytes, const std::string& name);

// One array, C order, read-only. Copyable: copies share the mapping (or inflated buffer).
class NpyArray {
 public:
  NpyArray() = default;
  NpyArray(std::string name, NpyHeader header, const uint8_t* data, std::shared_ptr<const void> owner)
      : name_(std::move(name)), header_(std::move(header)), data_(data), owner_(std::move(owner)) {}

  const std::string& name() const { return name_; }  // "DIR/train_x.npy" or "DIR/train.npz: x"
  NpyType type() const { return header_.type; }
  const std::vector<int64_t>& shape() const { return header_.shape; }
  int64_t numel() const { return header_.numel(); }
  // The elements, not necessarily aligned (a .npz member starts anywhere): read with memcpy.
  const uint8_t* data() const { return data_; }

 private:
  std::string name_;
  NpyHeader header_;
  const uint8_t* data_ = nullptr;
  std::shared_ptr<const void> owner_;
};

// Maps the .npy file `path`. Throws Error (kData), one line naming the file.
NpyArray open_npy(const std::string& path);

// The arrays `names` of the .npz archive `path` (members "<name>.npy"), in that order, sharing one
// mapping. Throws Error (kData), one line naming the archive and the member: not a zip archive,
// a missing member (naming those it has), encrypted, compressed other than by deflate, a damaged
// member (CRC-32, sizes), or a malformed .npy inside.
std::vector<NpyArray> open_npz(const std::string& path, const std::vector<std::string>& names);

// The bytes of a .npy file (version 1.0 header) holding `data`, shape `shape`, dtype `descr`
// ("|u1", "<f4", "<i8"): for tests and for `dtrain`'s fixtures; no checks.
std::vector<uint8_t> npy_bytes(const std::string& descr, const std::vector<int64_t>& shape,
                               std::span<const uint8_t> data);

}  // namespace dtrain
