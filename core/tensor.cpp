#include "core/tensor.h"

#include <cstdint>

#include <fmt/format.h>

#include "core/error.h"
#include "core/memory.h"

namespace dtrain {

struct Tensor::Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device;
  bool owned = true;
  Storage(size_t n, Device d) : ptr(device_alloc(d, n)), bytes(n), device(d) {}
  Storage(void* external, size_t n, Device d) : ptr(external), bytes(n), device(d), owned(false) {}
  ~Storage() {
    if (owned) device_free(device, ptr, bytes);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kI32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kU8: return 1;
    case DType::kI64: return 8;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float32";
    case DType::kI32: return "int32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kU8: return "uint8";
    case DType::kI64: return "int64";
  }
  return "?";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n))
      throw Error(fmt::format("shape {} has more elements than a 64-bit count holds", shape_str(shape)));
  }
  return n;
}

int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t product = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &product))
    throw Error(fmt::format("{}: {} x {} overflows 64 bits", what, a, b));
  return product;
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

namespace {

// Negative dimensions and byte counts beyond int64 are refused before anything is allocated.
void check_allocatable(const Shape& shape, DType dtype) {
  for (int64_t d : shape) DTRAIN_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  const int64_t numel = shape_numel(shape);
  if (numel > INT64_MAX / static_cast<int64_t>(dtype_size(dtype)))
    throw Error(fmt::format("a {} tensor of shape {} needs more bytes than a 64-bit size holds", dtype_name(dtype),
                            shape_str(shape)));
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, Device device, DType dtype) {
  check_allocatable(shape, dtype);
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device);
  return t;
}

Tensor Tensor::from_external(void* data, const Shape& shape, Device device, DType dtype) {
  check_allocatable(shape, dtype);
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  DTRAIN_CHECK(data != nullptr || t.nbytes() == 0, "from_external: null data for shape {}", shape_str(shape));
  t.storage_ = std::make_shared<Storage>(data, t.nbytes(), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, Device device, DType dtype) {
  Tensor t = empty(shape, device, dtype);
  t.zero_();
  return t;
}

Tensor Tensor::from_vector(std::span<const float> values, const Shape& shape, Device device) {
  DTRAIN_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "{} values for shape {}", values.size(),
               shape_str(shape));
  Tensor t = empty(shape, device);
  copy_bytes(t.raw(), device, values.data(), Device::cpu(), t.nbytes());
  return t;
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  if (i < 0) i += n;
  DTRAIN_CHECK(i >= 0 && i < n, "dim {} of a {}-d tensor", i, n);
  return shape_[i];
}

Device Tensor::device() const { return storage_ ? storage_->device : Device::cpu(); }

void* Tensor::raw() {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->ptr) + offset_ * dtype_size(dtype_);
}

const void* Tensor::raw() const { return const_cast<Tensor*>(this)->raw(); }

float* Tensor::data() {
  DTRAIN_CHECK(dtype_ == DType::kF32, "data() on a {} tensor", dtype_name(dtype_));
  return static_cast<float*>(raw());
}

const float* Tensor::data() const { return const_cast<Tensor*>(this)->data(); }

Tensor Tensor::view(const Shape& shape) const {
  DTRAIN_CHECK(shape_numel(shape) == numel(), "view {} of a tensor of shape {}", shape_str(shape), shape_str(shape_));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice(int64_t offset, const Shape& shape) const {
  DTRAIN_CHECK(offset >= 0 && offset + shape_numel(shape) <= numel(), "slice [{}, +{}) of {} elements", offset,
               shape_numel(shape), numel());
  Tensor t = *this;
  t.offset_ = offset_ + offset;
  t.shape_ = shape;
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  DTRAIN_CHECK(src.numel() == numel() && src.dtype_ == dtype_, "copy of {} {} into {} {}", dtype_name(src.dtype_),
               shape_str(src.shape_), dtype_name(dtype_), shape_str(shape_));
  copy_bytes(raw(), device(), src.raw(), src.device(), nbytes());
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, device, dtype_);
  t.copy_from(*this);
  return t;
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  copy_bytes(out.data(), Device::cpu(), data(), device(), nbytes());
  return out;
}

void Tensor::zero_() { zero_bytes(raw(), device(), nbytes()); }

void ensure_tensor(Tensor& t, const Shape& shape, Device device, DType dtype) {
  if (t.defined() && t.shape() == shape && t.device() == device && t.dtype() == dtype) return;
  t = Tensor::empty(shape, device, dtype);
}

}  // namespace dtrain
