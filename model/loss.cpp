#include "model/loss.h"

#include "core/error.h"
#include "core/memory.h"
#include "model/cpu_kernels.h"
#include "model/kernels.h"

namespace dtrain {

CrossEntropyLoss::CrossEntropyLoss(Reduction reduction, std::vector<float> class_weights)
    : reduction_(reduction), class_weights_host_(std::move(class_weights)) {
  for (float w : class_weights_host_) DTRAIN_CHECK(w >= 0.f, "negative class weight {}", w);
}

Tensor CrossEntropyLoss::forward(const Tensor& logits, const Tensor& labels) {
  DTRAIN_CHECK(logits.ndim() == 2 && labels.ndim() == 1 && labels.dim(0) == logits.dim(0) &&
                   labels.dtype() == DType::kI32,
               "cross-entropy of logits {} and labels {} ({})", shape_str(logits.shape()),
               shape_str(labels.shape()), dtype_name(labels.dtype()));
  const Device dev = logits.device();
  const int64_t rows = logits.dim(0), classes = logits.dim(1);
  const float* weights = nullptr;
  if (!class_weights_host_.empty()) {
    DTRAIN_CHECK(static_cast<int64_t>(class_weights_host_.size()) == classes, "{} class weights for {} classes",
                 class_weights_host_.size(), classes);
    if (!class_weights_.defined() || class_weights_.device() != dev)
      class_weights_ = Tensor::from_vector(class_weights_host_, {classes}, dev);
    weights = class_weights_.data();
  }
  ensure_tensor(grad_, logits.shape(), dev);
  ensure_tensor(row_loss_, {rows}, dev);
  ensure_tensor(row_weight_, {rows}, dev);
  ensure_tensor(totals_, {2}, dev);
  if (dev.is_cpu()) {  // one pass instead of three launches: the scale depends only on the labels
    cpu::cross_entropy(logits.data(), labels.data_as<int32_t>(), weights, rows, classes,
                       reduction_ == Reduction::kMean, grad_.data(), totals_.data());
    return totals_.slice(0, {1});
  }
  // The scale first, from the labels, so the rows pass writes the scaled gradient (as the CPU's
  // one pass does): no third pass over the [rows, classes] gradient, the same floats.
  launch(dev, 1,
         kernels::CrossEntropyScale{totals_.data(), labels.data_as<int32_t>(), weights, rows, classes,
                                    reduction_ == Reduction::kMean});
  launch_rows(dev, rows,
              kernels::CrossEntropyRows{grad_.data(), row_loss_.data(), row_weight_.data(), logits.data(),
                                        labels.data_as<int32_t>(), weights, classes, totals_.data() + 1});
  launch(dev, 1,
         kernels::CrossEntropyTotal{totals_.data(), row_loss_.data(), row_weight_.data(), rows,
                                    reduction_ == Reduction::kMean});
  return totals_.slice(0, {1});
}

float loss_value(const Tensor& scalar) {
  float v = 0.f;
  copy_bytes(&v, Device::cpu(), scalar.data(), scalar.device(), sizeof v);
  return v;
}

int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  const int64_t rows = logits.dim(0);
  Tensor hit = Tensor::empty({rows}, logits.device());
  launch(logits.device(), rows,
         kernels::ArgmaxEquals{hit.data(), logits.data(), labels.data_as<int32_t>(), logits.dim(1)});
  int64_t n = 0;
  for (float h : hit.to_vector()) n += h > 0.5f;
  return n;
}

}  // namespace dtrain
