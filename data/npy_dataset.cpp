// NpyDataset: opening the two splits' arrays, checking x, y and their agreement, and get().
#include "data/npy_dataset.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "data/labels.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void bad_data(const std::string& message) { throw Error(message, ErrorKind::kData); }

// Element i of an integer array of `type` at `p` (unaligned), widened; `big` when a uint64 does
// not fit int64.
int64_t integer_at(const uint8_t* p, NpyType type, int64_t i, bool* big) {
  const auto read = [&]<class T>(T) {
    T v;
    std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    return v;
  };
  switch (type) {
    case NpyType::kI8: return read(int8_t{});
    case NpyType::kU8: return read(uint8_t{});
    case NpyType::kI16: return read(int16_t{});
    case NpyType::kU16: return read(uint16_t{});
    case NpyType::kI32: return read(int32_t{});
    case NpyType::kU32: return read(uint32_t{});
    case NpyType::kI64: return read(int64_t{});
    case NpyType::kU64: {
      const uint64_t v = read(uint64_t{});
      *big = v > static_cast<uint64_t>(INT64_MAX);
      return static_cast<int64_t>(v);
    }
    default: return 0;
  }
}

struct SplitArrays {
  NpyArray x, y;
  std::string y_path;  // the file of y (the archive for a .npz), for the label rules' messages
};

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

SplitArrays open_split(const std::string& dir, const std::string& split) {
  const fs::path npz = fs::path(dir) / (split + ".npz");
  const fs::path x = fs::path(dir) / (split + "_x.npy"), y = fs::path(dir) / (split + "_y.npy");
  const bool have_npz = path_exists(npz), have_x = path_exists(x), have_y = path_exists(y);
  if (have_npz && (have_x || have_y))
    bad_data(fmt::format("{}: both {}.npz and {} hold the {} split: keep one", dir, split,
                         (have_x ? x : y).filename().string(), split));
  SplitArrays s;
  if (have_npz) {
    std::vector<NpyArray> a = open_npz(npz.string(), {"x", "y"});
    s.x = std::move(a[0]);
    s.y = std::move(a[1]);
    s.y_path = s.y.name();
    return s;
  }
  if (!have_x || !have_y)
    bad_data(fmt::format("{}: missing {} (NumPy data: {}.npz with arrays x and y, or {}_x.npy and {}_y.npy)", dir,
                         (have_x ? y : x).filename().string(), split, split, split));
  s.x = open_npy(x.string());
  s.y = open_npy(y.string());
  s.y_path = y.string();
  return s;
}

// The dataset of the first `limit` samples (all when 0) of checked arrays.
std::unique_ptr<NpyDataset> make_dataset(SplitArrays&& s, std::vector<int32_t> labels, Normalize norm, int64_t limit,
                                         int classes) {
  const auto n = static_cast<int64_t>(labels.size());
  const int64_t size = limit > 0 ? std::min(limit, n) : n;
  labels.resize(static_cast<size_t>(size));
  return std::make_unique<NpyDataset>(std::move(s.x), std::move(labels), size, norm, classes);
}

// A split's arrays checked alone: x's sample shape, y's labels, one label per sample.
struct CheckedSplit {
  Shape shape;
  std::vector<int32_t> labels;
};
CheckedSplit check_split(const SplitArrays& s);

}  // namespace

Shape npy_sample_shape(const NpyArray& x) {
  if (x.type() != NpyType::kU8 && x.type() != NpyType::kF32)
    bad_data(fmt::format("{}: dtype {} is not supported for x: uint8 (scaled by 1/255) or float32 (convert with "
                         "x.astype(np.float32))",
                         x.name(), npy_type_name(x.type())));
  const std::vector<int64_t>& d = x.shape();
  if (d.size() < 2 || d.size() > 4)
    bad_data(fmt::format("{}: shape {}: x must be [N, C, H, W], [N, H, W] or [N, D]", x.name(), shape_str(d)));
  if (d[0] == 0) bad_data(fmt::format("{}: shape {}: no samples", x.name(), shape_str(d)));
  if (std::find(d.begin(), d.end(), 0) != d.end())
    bad_data(fmt::format("{}: shape {}: a sample of zero elements", x.name(), shape_str(d)));
  if (d.size() == 2) return {d[1]};
  if (d.size() == 3) return {1, d[1], d[2]};
  return {d[1], d[2], d[3]};
}

std::vector<int32_t> npy_labels(const NpyArray& y) {
  if (!npy_type_is_integer(y.type()))
    bad_data(fmt::format("{}: dtype {} is not supported for y: integer class labels (int64, int32, uint8, ...)",
                         y.name(), npy_type_name(y.type())));
  if (y.shape().size() != 1)
    bad_data(fmt::format("{}: shape {}: y must be [N], one integer label per sample", y.name(), shape_str(y.shape())));
  std::vector<int32_t> out(static_cast<size_t>(y.shape()[0]));
  for (int64_t i = 0; i < y.shape()[0]; ++i) {
    bool big = false;
    const int64_t v = integer_at(y.data(), y.type(), i, &big);
    if (big || v < 0 || v > INT32_MAX)
      bad_data(fmt::format("{}: label {} of sample {} is out of range (labels are 0 to classes - 1)", y.name(),
                           big ? fmt::format("{}", static_cast<uint64_t>(v)) : fmt::format("{}", v), i));
    out[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  return out;
}

namespace {

// A float32 x holds no NaN or infinity: one would train to a diverged loss steps later, a
// message that names no file (uint8 pixels are finite by construction).
void check_finite(const NpyArray& x) {
  if (x.type() != NpyType::kF32) return;
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x.data() + 4 * i, 4);  // unaligned in a .npz
    if ((bits & 0x7f800000u) != 0x7f800000u) continue;
    float v;
    std::memcpy(&v, &bits, 4);
    const int64_t per_sample = n / x.shape()[0];
    bad_data(fmt::format("{}: sample {} holds {} (element {} of the sample): x must be finite", x.name(),
                         i / per_sample, v, i % per_sample));
  }
}

CheckedSplit check_split(const SplitArrays& s) {
  CheckedSplit out{npy_sample_shape(s.x), npy_labels(s.y)};
  check_finite(s.x);
  if (s.x.shape()[0] != s.y.shape()[0])
    bad_data(fmt::format("{}: {} samples, but {} has {} labels", s.x.name(), s.x.shape()[0], s.y.name(),
                         s.y.shape()[0]));
  return out;
}

}  // namespace

NpyDataset::NpyDataset(NpyArray x, std::vector<int32_t> labels, int64_t size, Normalize norm, int num_classes)
    : x_(std::move(x)), labels_(std::move(labels)), size_(size), norm_(norm), num_classes_(num_classes) {
  sample_shape_ = npy_sample_shape(x_);
  sample_numel_ = shape_numel(sample_shape_);
  sample_bytes_ = static_cast<size_t>(sample_numel_ * npy_type_size(x_.type()));
  DTRAIN_CHECK(size_ >= 0 && size_ <= x_.shape()[0] && static_cast<int64_t>(labels_.size()) >= size_,
               "{} samples of {} with {} labels", size_, x_.shape()[0], labels_.size());
}

int32_t NpyDataset::get(int64_t index, float* out) const {
  DTRAIN_CHECK(index >= 0 && index < size_, "sample {} of {}", index, size_);
  const uint8_t* src = x_.data() + static_cast<size_t>(index) * sample_bytes_;
  if (x_.type() == NpyType::kU8) {
    normalize_pixels(src, out, sample_numel_, norm_.mean, norm_.std);
  } else {
    std::memcpy(out, src, sample_bytes_);  // unaligned in a .npz: copied as bytes
    if (norm_.mean != 0.f || norm_.std != 1.f)
      for (int64_t i = 0; i < sample_numel_; ++i) out[i] = (out[i] - norm_.mean) / norm_.std;
  }
  return labels_[static_cast<size_t>(index)];
}

void NpyDataset::prefetch(int64_t index) const {
  if (index < 0 || index >= size_) return;
  const char* p = reinterpret_cast<const char*>(x_.data() + static_cast<size_t>(index) * sample_bytes_);
  for (size_t off = 0; off < sample_bytes_; off += 64) __builtin_prefetch(p + off);
}

DatasetSplits load_npy_splits(const std::string& dir, Normalize norm, int64_t train_limit, int64_t test_limit,
                              int num_classes) {
  if (train_limit < 0 || test_limit < 0)
    throw Error(fmt::format("sample limits must be >= 0, got {} and {}", train_limit, test_limit));
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) bad_data(fmt::format("{}: data directory not found", dir));
  SplitArrays train = open_split(dir, "train"), test = open_split(dir, "test");
  CheckedSplit train_checked = check_split(train), test_checked = check_split(test);
  if (test_checked.shape != train_checked.shape)
    bad_data(fmt::format("{}: samples of shape {}, but {} has samples of shape {}", test.x.name(),
                         shape_str(test_checked.shape), train.x.name(), shape_str(train_checked.shape)));
  int classes = 0;
  try {
    classes = training_classes(train_checked.labels, train.y_path, num_classes);
    check_test_labels(test_checked.labels, test.y_path, classes, train.y_path);
  } catch (Error& e) {
    e.set_kind(ErrorKind::kData);
    throw;
  }
  DatasetSplits out;
  out.train = make_dataset(std::move(train), std::move(train_checked.labels), norm, train_limit, classes);
  out.test = make_dataset(std::move(test), std::move(test_checked.labels), norm, test_limit, classes);
  return out;
}

std::unique_ptr<Dataset> load_npy_test_split(const std::string& dir, Normalize norm, int64_t limit) {
  if (limit < 0) throw Error(fmt::format("sample limit must be >= 0, got {}", limit));
  SplitArrays test = open_split(dir, "test");
  std::vector<int32_t> labels = check_split(test).labels;
  // The classes the test labels reach, bounded as training's are (data/labels.h); the weights
  // say how many the model has, and the caller checks the labels against them.
  const int64_t classes = labels.empty() ? 0 : int64_t{*std::max_element(labels.begin(), labels.end())} + 1;
  if (classes > kMaxLabelClasses)
    bad_data(fmt::format("{}: label {} would make {} classes, more than a model may have ({})", test.y_path,
                         classes - 1, classes, kMaxLabelClasses));
  return make_dataset(std::move(test), std::move(labels), norm, limit, static_cast<int>(classes));
}

bool has_npy_data(const std::string& dir) {
  return path_exists(fs::path(dir) / "train.npz") || path_exists(fs::path(dir) / "train_x.npy");
}

bool has_npy_test_data(const std::string& dir) {
  return path_exists(fs::path(dir) / "test.npz") || path_exists(fs::path(dir) / "test_x.npy");
}

}  // namespace dtrain
