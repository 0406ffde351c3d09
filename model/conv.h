// Conv2d (im2col + GEMM, one GEMM for the whole batch) and MaxPool2d, NCHW float32. On the CPU
// the passes around the GEMM are the loops of model/cpu_conv.h; on the GPU, the functors of
// model/kernels.h.
#pragma once

#include "model/init.h"
#include "model/kernels.h"
#include "model/module.h"

namespace dtrain {

// With AmpMode::kBf16 or kFp16 the three GEMMs (Y, dW, dcols) take 16-bit operands (the columns,
// the weight, dY) with float32 accumulation, like autocast; the bias and its gradient stay float32.
class Conv2d : public Module {
 public:
  // PyTorch's default initialisation: weight (then bias) U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from rng.
  // bias false: no bias parameter (ResNet's convolutions, each followed by BatchNorm).
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding, Device device,
         InitRng& rng, bool bias = true);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::vector<Parameter*> parameters() override {
    if (has_bias_) return {&weight_, &bias_};
    return {&weight_};
  }
  std::string describe() const override;
  bool absorb_following_relu() override { return relu_ = true; }
  void set_amp(AmpMode mode) override { amp_ = mode; }

 private:
  int64_t in_c_, out_c_, k_, stride_, pad_;
  bool has_bias_;
  AmpMode amp_ = AmpMode::kOff;
  DType half_ = DType::kF32;  // the last forward's operand format
  Tensor cols_half_, weight_half_, dy_half_;  // 16-bit copies of the GEMM operands
  bool relu_ = false;  // output is ReLU(conv): Note [Fused ReLU]
  Parameter weight_, bias_;  // weight [out_c, in_c, k, k]
  const float* bias_data() { return has_bias_ ? bias_.value.data() : nullptr; }
  // Note [Chunked CPU convolution] (conv.cpp): the CPU's float32 path, a few images at a time.
  void forward_cpu_chunks(const Tensor& input);
  Tensor backward_cpu_chunks(const Tensor& grad_output, bool need_input_grad);
  // Note [Direct CPU convolution] (cpu_direct_conv.cpp): 3x3 stride 1 on the wider planes.
  Tensor backward_cpu_direct(const Tensor& grad_output, bool need_input_grad);
  kernels::ConvGeometry geom_{};
  Tensor input_, output_, grad_input_;
  // GPU and 16-bit operands: the whole batch, [in_c*k*k, batch*oh*ow] (column n*oh*ow + p), kept
  // for backward, then dcols; the CPU's float32 path: one chunk of images, rebuilt in backward;
  // the direct kernels' scratch.
  Tensor cols_;
  Tensor out_cols_;  // [out_c, batch (or chunk) * oh*ow]: the GEMM's result, then dY in the same layout
  Tensor dw_t_;      // CPU float32: dW^T [in_c*k*k, out_c], summed over the chunks
  Tensor ones_;      // >= batch*oh*ow ones: the bias gradient as a GEMM (GPU)
  Tensor masked_;    // GPU with a fused ReLU: dY masked by the output, before the columns layout
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0);  // stride 0: = kernel
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::string describe() const override;

 private:
  int64_t k_, stride_, pad_;
  kernels::ConvGeometry geom_{};
  Shape input_shape_;
  Tensor output_, argmax_, grad_input_;
};

}  // namespace dtrain
