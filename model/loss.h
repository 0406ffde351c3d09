// CrossEntropyLoss (log-softmax fused, max-subtracted) with optional class weights and
// mean/sum reduction, PyTorch semantics: mean = sum_i w[y_i] l_i / sum_i w[y_i].
// The loss stays on the device (no host round trip per step); read it with loss_value().
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace dtrain {

enum class Reduction { kMean, kSum };

class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(Reduction reduction = Reduction::kMean, std::vector<float> class_weights = {});

  // logits [B, C] F32, labels [B] I32 on the same device. Returns a 1-element device tensor.
  Tensor forward(const Tensor& logits, const Tensor& labels);
  // Gradient of the loss with respect to the logits of the last forward().
  const Tensor& backward() const { return grad_; }

 private:
  Reduction reduction_;
  std::vector<float> class_weights_host_;
  Tensor class_weights_, grad_, row_loss_, row_weight_, totals_;
};

float loss_value(const Tensor& scalar);  // copies one float to the host

// Number of rows whose argmax equals the label.
int64_t count_correct(const Tensor& logits, const Tensor& labels);

}  // namespace dtrain
