// Tensor: a contiguous, typed buffer with a shape and a device. Copying a Tensor copies the
// handle, not the data (views share storage); data moves only through copy_from / to().
// Float32 is the working type; I32 holds labels, BF16/F16 hold compressed gradients, U8 holds
// bytes (strings and records that ranks exchange).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"

namespace dtrain {

enum class DType : uint8_t { kF32, kI32, kBF16, kF16, kU8, kI64 };  // kI64: counters (BatchNorm's num_batches_tracked)
size_t dtype_size(DType dtype);
inline bool is_integer(DType dtype) { return dtype == DType::kI32 || dtype == DType::kU8 || dtype == DType::kI64; }
const char* dtype_name(DType dtype);

using Shape = std::vector<int64_t>;
// The element count of `shape`; throws dtrain::Error naming the shape when it does not fit in
// int64 (a wrapped count would size a buffer smaller than what is written into it).
int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);
// a * b for sizes (a, b >= 0); throws dtrain::Error "<what>: <a> x <b> overflows 64 bits".
int64_t checked_mul(int64_t a, int64_t b, std::string_view what);

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, Device device = Device::cpu(), DType dtype = DType::kF32);
  static Tensor zeros(const Shape& shape, Device device = Device::cpu(), DType dtype = DType::kF32);
  static Tensor from_vector(std::span<const float> values, const Shape& shape, Device device = Device::cpu());
  // A tensor over memory this process did not allocate through dtrain (a shared-memory window,
  // say): never freed here; its owner must outlive every view.
  static Tensor from_external(void* data, const Shape& shape, Device device, DType dtype = DType::kF32);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const;

  float* data();  // F32 only (checked)
  const float* data() const;
  void* raw();
  const void* raw() const;
  template <class T> T* data_as() { return static_cast<T*>(raw()); }
  template <class T> const T* data_as() const { return static_cast<const T*>(raw()); }

  // Same storage, new shape of equal numel.
  Tensor view(const Shape& shape) const;
  // A view of `shape` starting `offset` elements into this tensor (bounds checked).
  Tensor slice(int64_t offset, const Shape& shape) const;
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }

  // Copies data (any device to any device); shapes must have equal numel and dtypes match.
  void copy_from(const Tensor& src);
  Tensor to(Device device) const;
  std::vector<float> to_vector() const;  // F32 only; copies to host
  void zero_();

 private:
  struct Storage;
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  DType dtype_ = DType::kF32;
};

// Makes `t` a tensor of `shape` on `device`, reallocating only when shape, device or dtype
// differ: layers keep their outputs and reuse them step after step.
void ensure_tensor(Tensor& t, const Shape& shape, Device device, DType dtype = DType::kF32);

}  // namespace dtrain
