// MnistDataset: loading and checking the IDX pair of one split (or both splits, in parallel,
// checked against each other), and get(), which normalises.
#include "data/mnist.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "data/idx_reader.h"
#include "data/labels.h"

namespace dtrain {

// The loader runs beside training on shared cores (every rank has one), so this loop is built
// for AVX-512, AVX2 and plain x86-64 and the best is picked at load time: IEEE division is exact
// at any vector width, so every clone gives the same floats. Computed per pixel rather than
// looked up in a 256-entry table, since a lookup is a gather and does not vectorise.
// ThreadSanitizer instruments the clones' resolver, which runs before its runtime is up and
// crashes the program at start-up: a TSan build takes the default clone only.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void normalize_pixels(const uint8_t* src, float* out, int64_t n, float mean, float std) {
  if (mean == 0.f && std == 1.f) {  // the default: x - 0 and x / 1 are exact, so skip them
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(src[i]) / 255.0f;
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = (static_cast<float>(src[i]) / 255.0f - mean) / std;
}

namespace {

namespace fs = std::filesystem;

// The .gz file when present, else the raw one; throws naming both when neither exists, and the
// real cause when the directory cannot be searched (a folder of mode 000 is not an empty one).
std::string find_file(const std::string& dir, const std::string& stem) {
  for (const fs::path& path : {fs::path(dir) / (stem + ".gz"), fs::path(dir) / stem}) {
    std::error_code ec;
    if (fs::exists(path, ec)) return path.string();
    if (ec == std::errc::permission_denied)
      throw Error(fmt::format("{}: permission denied (looking for {}.gz or {} in {})", path.string(), stem, stem, dir));
    if (ec) throw Error(fmt::format("{}: cannot look for it: {}", path.string(), ec.message()));
  }
  throw Error(fmt::format("{}: missing {}.gz (or uncompressed {})", dir, stem, stem));
}

void check_directory(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(fmt::format(
        "{}: dataset directory not found (install Fashion-MNIST with `apt-get install dataset-fashion-mnist`, "
        "which puts it in /usr/share/datasets/fashion-mnist)",
        dir));
}

void check_limit(int64_t limit) {
  if (limit < 0) throw Error(fmt::format("MNIST sample limit must be >= 0, got {}", limit));
}

// One split's two files as read, checked against each other but not yet against the other split.
struct SplitFiles {
  std::string image_path, label_path;
  IdxArray images, labels;
  Shape sample_shape;  // {channels, rows, cols}
};

SplitFiles read_split(const std::string& dir, Split split) {
  SplitFiles s;
  s.image_path = find_file(dir, MnistDataset::file_stem(split, true));
  s.label_path = find_file(dir, MnistDataset::file_stem(split, false));
  s.images = read_idx(s.image_path);
  s.labels = read_idx(s.label_path);
  const std::vector<int64_t>& d = s.images.dims;
  if (d.size() == 3) {
    s.sample_shape = {1, d[1], d[2]};
  } else if (d.size() == 4) {
    s.sample_shape = {d[1], d[2], d[3]};
  } else {
    throw Error(fmt::format("{}: expected a 3-d image array [count, rows, cols] or a 4-d one [count, channels, rows, "
                            "cols], got {} dimensions",
                            s.image_path, d.size()));
  }
  if (s.labels.dims.size() != 1)
    throw Error(fmt::format("{}: expected a 1-d label array, got {} dimensions", s.label_path, s.labels.dims.size()));
  if (d[0] != s.labels.dims[0])
    throw Error(fmt::format("{}: {} images, but {} has {} labels", s.image_path, d[0], s.label_path,
                            s.labels.dims[0]));
  return s;
}

// The classes `labels` name: max label + 1 (0 when there are none).
int count_classes(const std::vector<uint8_t>& labels) {
  return labels.empty() ? 0 : *std::max_element(labels.begin(), labels.end()) + 1;
}

// The labels as int32, for the rules every format shares (data/labels.h).
std::vector<int32_t> widened(const std::vector<uint8_t>& labels) { return {labels.begin(), labels.end()}; }

// The dataset of the first `limit` samples (all when 0), taking the files' buffers.
std::unique_ptr<MnistDataset> make_dataset(SplitFiles&& s, Normalize norm, int64_t limit, int num_classes) {
  if (limit > 0 && limit < s.images.dims[0]) {
    s.images.data.resize(static_cast<size_t>(limit * shape_numel(s.sample_shape)));
    s.images.data.shrink_to_fit();
    s.labels.data.resize(static_cast<size_t>(limit));
  }
  return std::make_unique<MnistDataset>(std::move(s.images.data), std::move(s.labels.data), s.sample_shape, norm,
                                        num_classes);
}

}  // namespace

std::string MnistDataset::file_stem(Split split, bool images) {
  const char* prefix = split == Split::kTrain ? "train" : "t10k";
  return fmt::format("{}-{}-ubyte", prefix, images ? "images-idx3" : "labels-idx1");
}

std::unique_ptr<MnistDataset> MnistDataset::load(const std::string& dir, Split split, Normalize norm,
                                                 int64_t limit, int num_classes) {
  check_limit(limit);
  check_directory(dir);
  SplitFiles files = read_split(dir, split);
  // The whole file: a limit never changes them. Training labels make a model's classes, so
  // they alone are held to the far-label rule when no count is given.
  const int classes = split == Split::kTrain || num_classes > 0
                          ? training_classes(widened(files.labels.data), files.label_path, num_classes)
                          : count_classes(files.labels.data);
  return make_dataset(std::move(files), norm, limit, classes);
}

MnistSplits load_mnist_splits(const std::string& dir, Normalize norm, int64_t train_limit, int64_t test_limit,
                              int num_classes) {
  check_limit(train_limit);
  check_limit(test_limit);
  check_directory(dir);
  SplitFiles train, test;
  std::exception_ptr train_error, test_error;
  std::thread test_reader([&] {
    try {
      test = read_split(dir, Split::kTest);
    } catch (...) {
      test_error = std::current_exception();
    }
  });
  try {
    train = read_split(dir, Split::kTrain);
  } catch (...) {
    train_error = std::current_exception();
  }
  test_reader.join();
  if (train_error) std::rethrow_exception(train_error);
  if (test_error) std::rethrow_exception(test_error);
  if (test.sample_shape != train.sample_shape)
    throw Error(fmt::format("{}: images of shape {}, but {} has images of shape {}", test.image_path,
                            shape_str(test.sample_shape), train.image_path, shape_str(train.sample_shape)));
  const int classes = training_classes(widened(train.labels.data), train.label_path, num_classes);
  check_test_labels(widened(test.labels.data), test.label_path, classes, train.label_path);
  MnistSplits out;
  out.train = make_dataset(std::move(train), norm, train_limit, classes);
  out.test = make_dataset(std::move(test), norm, test_limit, classes);
  return out;
}

MnistDataset::MnistDataset(std::vector<uint8_t> images, std::vector<uint8_t> labels, Shape sample_shape,
                           Normalize norm, int num_classes)
    : images_(std::move(images)), labels_(std::move(labels)), sample_shape_(std::move(sample_shape)), norm_(norm) {
  if (sample_shape_.size() != 3 || sample_shape_[0] <= 0 || sample_shape_[1] <= 0 || sample_shape_[2] <= 0)
    throw Error(fmt::format("MNIST samples must be non-empty [channels, rows, cols], got {}", shape_str(sample_shape_)));
  sample_bytes_ = shape_numel(sample_shape_);
  if (images_.size() / static_cast<size_t>(sample_bytes_) != labels_.size() ||
      images_.size() % static_cast<size_t>(sample_bytes_) != 0)
    throw Error(fmt::format("MNIST data: {} image bytes for {} labels of {} images", images_.size(), labels_.size(),
                            shape_str(sample_shape_)));
  const int present = count_classes(labels_);
  if (num_classes < 0 || (num_classes > 0 && present > num_classes))
    throw Error(fmt::format("MNIST data: label {} is out of range [0, {})", present - 1, num_classes));
  num_classes_ = num_classes > 0 ? num_classes : present;
  if (!std::isfinite(norm.mean) || !std::isfinite(norm.std) || norm.std == 0.0f)
    throw Error(fmt::format("MNIST normalisation needs a finite mean and non-zero std, got mean {} std {}", norm.mean,
                            norm.std));
}

MnistDataset::MnistDataset(std::vector<uint8_t> images, std::vector<uint8_t> labels, int64_t rows, int64_t cols,
                           Normalize norm)
    : MnistDataset(std::move(images), std::move(labels), Shape{1, rows, cols}, norm) {}

const uint8_t* MnistDataset::pixels(int64_t index) const {
  DTRAIN_CHECK(index >= 0 && index < size(), "sample {} of {}", index, size());
  return images_.data() + index * sample_bytes_;
}

int32_t MnistDataset::label(int64_t index) const {
  DTRAIN_CHECK(index >= 0 && index < size(), "sample {} of {}", index, size());
  return labels_[static_cast<size_t>(index)];
}

void MnistDataset::prefetch(int64_t index) const {
  if (index < 0 || index >= size()) return;
  const char* p = reinterpret_cast<const char*>(images_.data() + index * sample_bytes_);
  for (int64_t off = 0; off < sample_bytes_; off += 64) __builtin_prefetch(p + off);
}

int32_t MnistDataset::get(int64_t index, float* out) const {
  normalize_pixels(pixels(index), out, sample_bytes_, norm_.mean, norm_.std);
  return labels_[static_cast<size_t>(index)];
}

}  // namespace dtrain
