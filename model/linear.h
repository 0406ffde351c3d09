// Linear: y = x W^T + b, W stored [out, in] as in PyTorch. Input [B, in].
#pragma once

#include "model/init.h"
#include "model/module.h"

namespace dtrain {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Device device, InitRng& rng, bool bias = true);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::vector<Parameter*> parameters() override;
  std::string describe() const override;

 private:
  int64_t in_, out_;
  bool has_bias_;
  Parameter weight_, bias_;
  Tensor input_, output_, grad_input_;
  Tensor ones_;  // [batch] of 1: the bias gradient is the GEMM ones^T dY (fast on BLAS and cuBLAS)
};

}  // namespace dtrain
