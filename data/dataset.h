// Dataset: random access to (image, label) samples, already normalised to float.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dtrain {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Shape sample_shape() const = 0;  // e.g. {1, 28, 28}
  virtual int num_classes() const = 0;
  // Writes sample `index` (shape_numel(sample_shape()) floats) to `out`; returns its label.
  virtual int32_t get(int64_t index, float* out) const = 0;
  // A hint that get(index) comes next: the loader reads samples in shuffled order, so each one
  // starts with a cache miss unless it is asked for ahead. Never required for correctness.
  virtual void prefetch(int64_t /*index*/) const {}
};

}  // namespace dtrain
