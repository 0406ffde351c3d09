#include "model/conv.h"

#include <algorithm>

#include "core/error.h"
#include "core/ops.h"
#include "model/cpu_conv.h"
#include "model/cpu_direct_conv.h"
#include "model/cpu_winograd_conv.h"

namespace dtrain {

static kernels::ConvGeometry geometry(const Tensor& x, int64_t k, int64_t stride, int64_t pad) {
  DTRAIN_CHECK(x.ndim() == 4, "expected NCHW input, got {}", shape_str(x.shape()));
  kernels::ConvGeometry g{x.dim(1), x.dim(2), x.dim(3), k, k, stride, pad, 0, 0};
  // A window larger than the padded input has no output (as in PyTorch); without this check the
  // division below truncates a negative numerator to 0 and makes one.
  DTRAIN_CHECK(g.h + 2 * pad >= k && g.w + 2 * pad >= k, "kernel {} too large for input {}", k, shape_str(x.shape()));
  g.oh = (g.h + 2 * pad - k) / stride + 1;
  g.ow = (g.w + 2 * pad - k) / stride + 1;
  DTRAIN_CHECK(g.oh > 0 && g.ow > 0, "kernel {} too large for input {}", k, shape_str(x.shape()));
  checked_mul(g.oh, g.ow, "output pixels");
  return g;
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding,
               Device device, InitRng& rng, bool bias)
    : in_c_(in_channels), out_c_(out_channels), k_(kernel), stride_(stride), pad_(padding), has_bias_(bias) {
  DTRAIN_CHECK(in_channels > 0 && out_channels > 0 && kernel > 0 && stride > 0 && padding >= 0,
               "Conv2d({}, {}, kernel {}, stride {}, padding {})", in_channels, out_channels, kernel, stride, padding);
  const int64_t fan_in = checked_mul(checked_mul(in_c_, k_, "Conv2d fan-in"), k_, "Conv2d fan-in");
  checked_mul(out_c_, fan_in, "Conv2d weight");  // before any allocation
  weight_ = {"weight", Tensor::empty({out_c_, in_c_, k_, k_}, device), Tensor::zeros({out_c_, in_c_, k_, k_}, device)};
  uniform_init(weight_.value, fan_in_bound(fan_in), rng);
  if (!has_bias_) return;
  bias_ = {"bias", Tensor::empty({out_c_}, device), Tensor::zeros({out_c_}, device)};
  uniform_init(bias_.value, fan_in_bound(fan_in), rng);
}

// Note [Chunked CPU convolution]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// On the GPU, and with 16-bit operands, a call runs one im2col of the whole batch and one GEMM,
// and keeps the columns for backward. On the CPU in float32 that buffer, [in_c*k*k, batch*oh*ow],
// is far beyond the caches (29 MB for ResNet-18's layer1 at width 16 and batch 64, 450 MB at
// evaluation's batch of 1000): the im2col, the GEMM's packing, the moves to and from NCHW and
// col2im all streamed it through memory, and its first touch cost page clearing (issue 24's
// profile: the GEMM kernel was 43% of a step, those passes together about 40%). So the CPU
// goes a chunk of images at a time, as PyTorch's slow_conv2d goes image by image: im2col of
// the chunk, the GEMM, the result to NCHW with the bias and ReLU (with one image the GEMM's
// [out_c, oh*ow] is already NCHW: it writes the output directly); backward takes the chunk's
// dY to the columns layout (again nothing to move for one image without a ReLU or bias),
// rebuilds its columns (an im2col is a copy, a small part of the two GEMMs it feeds), adds
// its dW (beta 1 after the first chunk) and scatters its dcols by col2im at once. dW is
// computed transposed, dW^T = cols dY'^T into [in_c*k*k, out_c], and moved into the gradient
// after the last chunk: OpenBLAS ran that product 20-30% faster than dY' cols^T at layer1's
// shapes and 3-11% at layer3's and layer4's (bench/kernel_bench.cpp, resnet_l*_dW*, CPU time,
// Haswell and SkylakeX kernels). No column buffer outlives a call, and what the passes touch
// stays in L2. A chunk is the most images whose columns fit in kCpuConvChunkBytes (at least
// one; 256 KB to 2 MB ran alike here): a function of the layer and the batch, never of the
// thread count, so a run stays bitwise repeatable. dW and db are now sums over chunks in
// order (the GEMM's own order within one), not the whole batch's single GEMM: equal within
// float rounding, not the same bits. Y and dX are each element still one GEMM sum over the
// same k.
namespace {

constexpr int64_t kCpuConvChunkBytes = int64_t{512} << 10;

// The scratch of the direct kernels and, for the layers winograd_tile picks, of the Winograd
// forward and input gradient (which take their place).
int64_t direct_scratch_floats(const cpu::DirectConv& d, const cpu::WinogradConv& wd) {
  const int64_t direct = cpu::direct_conv_scratch_floats(d);
  return wd.m ? std::max(direct, cpu::winograd_conv_scratch_floats(wd)) : direct;
}

int64_t chunk_images(int64_t rows, int64_t plane, int64_t batch) {
  const int64_t per_image = std::max<int64_t>(1, rows * plane * static_cast<int64_t>(sizeof(float)));
  return std::clamp<int64_t>(kCpuConvChunkBytes / per_image, 1, std::max<int64_t>(1, batch));
}

}  // namespace

// Per call, whatever the batch: forward im2col, GEMM, to-NCHW with bias (and ReLU); backward
// to-columns (with the ReLU mask; on the CPU with the bias gradient too), the bias GEMM on the
// GPU, the weight GEMM, plus the GEMM and col2im with the input gradient. The CPU's float32
// path does the same a chunk of images at a time (forward_cpu_chunks).
Tensor Conv2d::forward(const Tensor& input) {
  geom_ = geometry(input, k_, stride_, pad_);
  DTRAIN_CHECK(geom_.c == in_c_, "Conv2d expects {} channels, got {}", in_c_, geom_.c);
  const Device dev = weight_.value.device();
  const int64_t batch = input.dim(0), plane = geom_.oh * geom_.ow, rows = in_c_ * k_ * k_;
  checked_mul(batch, plane, "Conv2d columns (batch x output pixels)");  // the column buffers' widths
  input_ = input;
  ensure_tensor(output_, {batch, out_c_, geom_.oh, geom_.ow}, dev);
  half_ = amp_operand_dtype(amp_);
  if (dev.is_cpu() && half_ == DType::kF32) {
    if (cpu::direct_conv_fits(geom_)) {  // Note [Direct CPU convolution] (model/cpu_direct_conv.cpp)
      const cpu::DirectConv d{geom_, batch, out_c_};
      const cpu::WinogradConv wd{geom_, batch, out_c_, cpu::winograd_tile(geom_, out_c_)};
      ensure_tensor(cols_, {direct_scratch_floats(d, wd)}, dev);
      if (wd.m)  // Note [Winograd CPU convolution] (model/cpu_winograd_conv.cpp)
        cpu::winograd_conv_forward(wd, input.data(), weight_.value.data(), bias_data(), relu_, output_.data(),
                                   cols_.data());
      else
        cpu::direct_conv_forward(d, input.data(), weight_.value.data(), bias_data(), relu_, output_.data(),
                                 cols_.data());
    } else {
      forward_cpu_chunks(input);
    }
    return output_;
  }
  ensure_tensor(cols_, {rows, batch * plane}, dev);
  ensure_tensor(out_cols_, {out_c_, batch * plane}, dev);
  if (dev.is_cpu())
    cpu::im2col(input.data(), geom_, batch, cols_.data());
  else
    launch(dev, cols_.numel(), kernels::Im2col{cols_.data(), input.data(), geom_, batch});
  if (half_ != DType::kF32) {  // the columns stay packed for backward's dW
    pack_half(half_, cols_, cols_half_);
    pack_half(half_, weight_.value, weight_half_);
    gemm_half(dev, half_, false, false, out_c_, batch * plane, rows, 1.f, weight_half_.data_as<uint16_t>(),
              cols_half_.data_as<uint16_t>(), 0.f, out_cols_.data());
  } else {
    gemm(dev, false, false, out_c_, batch * plane, rows, 1.f, weight_.value.data(), cols_.data(), 0.f,
         out_cols_.data());
  }
  if (dev.is_cpu()) {
    cpu::columns_to_nchw_bias(out_cols_.data(), bias_data(), batch, out_c_, plane, relu_, output_.data());
    return output_;
  }
  launch(dev, output_.numel(),
         kernels::ColumnsToNchwBias{output_.data(), out_cols_.data(), bias_data(), batch, out_c_, plane});
  if (relu_) launch(dev, output_.numel(), kernels::ReluForward{output_.data(), output_.data()});
  return output_;
}

void Conv2d::forward_cpu_chunks(const Tensor& input) {
  const Device dev = weight_.value.device();
  const int64_t batch = input.dim(0), plane = geom_.oh * geom_.ow, rows = in_c_ * k_ * k_;
  const int64_t in_size = in_c_ * geom_.h * geom_.w, out_size = out_c_ * plane;
  const int64_t chunk = chunk_images(rows, plane, batch);
  ensure_tensor(cols_, {rows, chunk * plane}, dev);
  ensure_tensor(out_cols_, {out_c_, chunk * plane}, dev);
  for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
    const int64_t nb = std::min(chunk, batch - n0);
    float* y = output_.data() + n0 * out_size;
    cpu::im2col(input.data() + n0 * in_size, geom_, nb, cols_.data());
    if (nb == 1) {  // [out_c, plane] is this image's NCHW output
      gemm(dev, false, false, out_c_, plane, rows, 1.f, weight_.value.data(), cols_.data(), 0.f, y);
      cpu::bias_relu(y, bias_data(), out_c_, plane, relu_);
      continue;
    }
    gemm(dev, false, false, out_c_, nb * plane, rows, 1.f, weight_.value.data(), cols_.data(), 0.f,
         out_cols_.data());
    cpu::columns_to_nchw_bias(out_cols_.data(), bias_data(), nb, out_c_, plane, relu_, y);
  }
}

// The chunks of forward_cpu_chunks again. A batch of 0 still runs once (nb 0), so the
// gradients are written (beta 0) or kept (beta 1) as the whole-batch GEMMs would.
Tensor Conv2d::backward_cpu_chunks(const Tensor& grad_output, bool need_input_grad) {
  const Device dev = weight_.value.device();
  const int64_t batch = input_.dim(0), plane = geom_.oh * geom_.ow, rows = in_c_ * k_ * k_;
  const int64_t in_size = in_c_ * geom_.h * geom_.w, out_size = out_c_ * plane;
  const int64_t chunk = chunk_images(rows, plane, batch);
  const float beta_b = has_bias_ ? take_grad_beta(bias_) : 0.f;  // before reading bias_.grad (module.h)
  const float beta_w = take_grad_beta(weight_);
  if (need_input_grad) ensure_tensor(grad_input_, input_.shape(), dev);
  ensure_tensor(dw_t_, {rows, out_c_}, dev);
  for (int64_t n0 = 0; n0 == 0 || n0 < batch; n0 += chunk) {
    const int64_t nb = std::min(chunk, batch - n0);
    const float* dyc = grad_output.data() + n0 * out_size;  // one image's dY is already [out_c, plane]
    if (nb != 1 || relu_ || has_bias_) {
      cpu::nchw_to_columns(dyc, relu_ ? output_.data() + n0 * out_size : nullptr, nb, out_c_, plane,
                           out_cols_.data(), has_bias_ ? bias_.grad.data() : nullptr, n0 == 0 ? beta_b : 1.f);
      dyc = out_cols_.data();
    }
    cpu::im2col(input_.data() + n0 * in_size, geom_, nb, cols_.data());
    // dW^T (+)= cols dY'^T: the product transposed, as OpenBLAS runs it faster with out_c
    // columns than with out_c rows (bench/kernel_bench.cpp resnet_l*_dW*: 30% at layer1).
    gemm(dev, false, true, rows, out_c_, nb * plane, 1.f, cols_.data(), dyc, n0 == 0 ? 0.f : 1.f, dw_t_.data());
    if (!need_input_grad) continue;
    // The chunk's columns are no longer needed: dcols = W^T dY' takes their place.
    gemm(dev, true, false, rows, nb * plane, out_c_, 1.f, weight_.value.data(), dyc, 0.f, cols_.data());
    cpu::col2im(cols_.data(), geom_, nb, grad_input_.data() + n0 * in_size);
  }
  cpu::transpose_into(dw_t_.data(), rows, out_c_, weight_.grad.data(), beta_w);
  if (has_bias_) grad_ready(bias_);
  grad_ready(weight_);
  if (!need_input_grad) return {};
  return grad_input_;
}

// The direct kernels' backward (Note [Direct CPU convolution]): dW (and db) over the whole
// batch, then dX, in one call; the scratch is forward's.
Tensor Conv2d::backward_cpu_direct(const Tensor& grad_output, bool need_input_grad) {
  const Device dev = weight_.value.device();
  const cpu::DirectConv d{geom_, input_.dim(0), out_c_};
  const cpu::WinogradConv wd{geom_, input_.dim(0), out_c_, cpu::winograd_tile(geom_, out_c_)};
  const float beta_b = has_bias_ ? take_grad_beta(bias_) : 0.f;  // before reading bias_.grad (module.h)
  const float beta_w = take_grad_beta(weight_);
  if (need_input_grad) ensure_tensor(grad_input_, input_.shape(), dev);
  ensure_tensor(cols_, {direct_scratch_floats(d, wd)}, dev);
  const float* relu_output = relu_ ? output_.data() : nullptr;
  cpu::direct_conv_backward(d, input_.data(), weight_.value.data(), grad_output.data(), relu_output,
                            need_input_grad && !wd.m ? grad_input_.data() : nullptr, weight_.grad.data(), beta_w,
                            has_bias_ ? bias_.grad.data() : nullptr, beta_b, cols_.data());
  if (need_input_grad && wd.m)  // dW stays direct; dX by Winograd (Note [Winograd CPU convolution])
    cpu::winograd_conv_input_grad(wd, weight_.value.data(), grad_output.data(), relu_output, grad_input_.data(),
                                  cols_.data());
  if (has_bias_) grad_ready(bias_);
  grad_ready(weight_);
  if (!need_input_grad) return {};
  return grad_input_;
}

Tensor Conv2d::backward(const Tensor& grad_output, bool need_input_grad) {
  const Device dev = weight_.value.device();
  const int64_t batch = input_.dim(0), plane = geom_.oh * geom_.ow, rows = in_c_ * k_ * k_;
  const int64_t ncols = batch * plane;
  DTRAIN_CHECK(grad_output.numel() == output_.numel(), "Conv2d backward got {}", shape_str(grad_output.shape()));
  if (dev.is_cpu() && half_ == DType::kF32 && cpu::direct_conv_fits(geom_))
    return backward_cpu_direct(grad_output, need_input_grad);
  if (dev.is_cpu() && half_ == DType::kF32) return backward_cpu_chunks(grad_output, need_input_grad);
  // out_cols_ held forward's GEMM result, no longer needed: it now takes dY in the columns layout.
  const float beta_b = has_bias_ ? take_grad_beta(bias_) : 0.f;  // before reading bias_.grad (module.h)
  if (dev.is_cpu()) {
    cpu::nchw_to_columns(grad_output.data(), relu_ ? output_.data() : nullptr, batch, out_c_, plane,
                         out_cols_.data(), has_bias_ ? bias_.grad.data() : nullptr, beta_b);
  } else {
    const float* dy = grad_output.data();
    if (relu_) {
      ensure_tensor(masked_, output_.shape(), dev);
      launch(dev, masked_.numel(), kernels::ReluBackward{masked_.data(), dy, output_.data()});
      dy = masked_.data();
    }
    launch(dev, out_cols_.numel(), kernels::NchwToColumns{out_cols_.data(), dy, batch, out_c_, plane});
    // db = dY' 1 as a GEMM (a parallel reduction on the GPU); beta 0 overwrites after zero_grad.
    if (has_bias_)
      gemm(dev, false, false, out_c_, 1, ncols, 1.f, out_cols_.data(), ones(ones_, ncols, dev), beta_b,
           bias_.grad.data());
  }
  if (has_bias_) grad_ready(bias_);
  const bool half = half_ != DType::kF32;
  if (half) pack_half(half_, out_cols_, dy_half_);
  const float beta_w = take_grad_beta(weight_);
  if (half && dev.is_cpu()) {
    // dW^T and its move, as the float32 path computes dW (Note [Chunked CPU convolution]): the
    // same products on 16-bit-rounded operands give the same bits.
    ensure_tensor(dw_t_, {rows, out_c_}, dev);
    gemm_half(dev, half_, false, true, rows, out_c_, ncols, 1.f, cols_half_.data_as<uint16_t>(),
              dy_half_.data_as<uint16_t>(), 0.f, dw_t_.data());
    cpu::transpose_into(dw_t_.data(), rows, out_c_, weight_.grad.data(), beta_w);
  } else if (half) {
    gemm_half(dev, half_, false, true, out_c_, rows, ncols, 1.f, dy_half_.data_as<uint16_t>(),
              cols_half_.data_as<uint16_t>(), beta_w, weight_.grad.data());
  } else {
    gemm(dev, false, true, out_c_, rows, ncols, 1.f, out_cols_.data(), cols_.data(), beta_w,
         weight_.grad.data());  // dW (+)= dY' cols^T
  }
  grad_ready(weight_);
  if (!need_input_grad) return {};
  ensure_tensor(grad_input_, input_.shape(), dev);
  // The columns are no longer needed: reuse them for dcols = W^T dY'.
  if (half)
    gemm_half(dev, half_, true, false, rows, ncols, out_c_, 1.f, weight_half_.data_as<uint16_t>(),
              dy_half_.data_as<uint16_t>(), 0.f, cols_.data());
  else
    gemm(dev, true, false, rows, ncols, out_c_, 1.f, weight_.value.data(), out_cols_.data(), 0.f, cols_.data());
  if (dev.is_cpu())
    cpu::col2im(cols_.data(), geom_, batch, grad_input_.data());
  else
    launch(dev, grad_input_.numel(), kernels::Col2im{grad_input_.data(), cols_.data(), geom_, batch});
  return grad_input_;
}

std::string Conv2d::describe() const {
  return fmt::format("Conv2d({}, {}, kernel={}, stride={}, padding={}{})", in_c_, out_c_, k_, stride_, pad_,
                     has_bias_ ? "" : ", bias=False");
}

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : k_(kernel), stride_(stride > 0 ? stride : kernel), pad_(padding) {
  DTRAIN_CHECK(kernel > 0 && padding >= 0 && 2 * padding <= kernel, "MaxPool2d kernel {} padding {}", kernel,
               padding);
}

Tensor MaxPool2d::forward(const Tensor& input) {
  geom_ = geometry(input, k_, stride_, pad_);
  input_shape_ = input.shape();
  const int64_t batch = input.dim(0), channels = geom_.c;
  ensure_tensor(output_, {batch, channels, geom_.oh, geom_.ow}, input.device());
  ensure_tensor(argmax_, output_.shape(), input.device(), DType::kI32);
  if (input.device().is_cpu()) {
    cpu::maxpool_forward(input.data(), geom_, batch * channels, output_.data(), argmax_.data_as<int32_t>());
    return output_;
  }
  launch(input.device(), output_.numel(),
         kernels::MaxPoolForward{output_.data(), argmax_.data_as<int32_t>(), input.data(), geom_});
  return output_;
}

Tensor MaxPool2d::backward(const Tensor& grad_output, bool need_input_grad) {
  if (!need_input_grad) return {};
  ensure_tensor(grad_input_, input_shape_, grad_output.device());
  DTRAIN_CHECK(grad_output.numel() == output_.numel(), "MaxPool2d backward got {}", shape_str(grad_output.shape()));
  if (grad_output.device().is_cpu()) {
    cpu::maxpool_backward(grad_output.data(), argmax_.data_as<int32_t>(), geom_, input_shape_[0] * input_shape_[1],
                          grad_input_.data());
    return grad_input_;
  }
  launch(grad_output.device(), grad_input_.numel(),
         kernels::MaxPoolBackward{grad_input_.data(), grad_output.data(), argmax_.data_as<int32_t>(), geom_});
  return grad_input_;
}

std::string MaxPool2d::describe() const {
  return fmt::format("MaxPool2d(kernel={}, stride={}, padding={})", k_, stride_, pad_);
}

}  // namespace dtrain
