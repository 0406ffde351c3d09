// ResNet-18 (torchvision's layout: BasicBlock x [2, 2, 2, 2]) with the stem people use for small
// images (conv1 3x3 stride 1, no max-pool) and base width `width` (64 in torchvision), built as a
// Sequential of named children so that parameters and buffers carry torchvision's names
// ("conv1.weight", "bn1.running_mean", "layer2.0.downsample.1.weight", "fc.bias") and a
// safetensors file loads strictly on either side (as ../shared/peers/torch_resnet_peer.py builds it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/batchnorm.h"
#include "model/conv.h"
#include "model/init.h"
#include "model/sequential.h"

namespace dtrain {

struct LayerSize;

// torchvision's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + identity), the identity
// downsample.1(downsample.0(x)) (1x1 convolution with the stride, then BatchNorm) when the
// stride or the width changes, else x. Convolutions without bias. x [N, in, H, W] ->
// [N, out, H/stride, W/stride].
class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride, Device device, InitRng& rng);
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::vector<Parameter*> parameters() override;
  std::vector<Buffer*> buffers() override;
  void set_training(bool training) override;
  void set_amp(AmpMode mode) override;
  void set_grad_ready_hook(GradReadyHook hook) override;
  void set_batch_stats_sync(std::shared_ptr<BatchStatsSync> sync) override;
  std::string describe() const override;
  // Note [Chained joins] (model/resnet.cpp): `later` takes `earlier`'s output as its input.
  // Either may be null: a block that another pipeline stage holds (Note [ResNet pipeline
  // stages]), which its own stage's build chains.
  static void chain(BasicBlock* earlier, BasicBlock* later);

 private:
  std::vector<Module*> children();
  int64_t in_c_, out_c_, stride_;
  Conv2d conv1_;
  BatchNorm bn1_;  // with conv1's ReLU fused
  Conv2d conv2_;
  BatchNorm bn2_;
  std::unique_ptr<Sequential> downsample_;  // nullptr: the identity
  bool grad_output_masked_ = false;  // chained: backward's grad_output is already 0 where out_ is
  bool mask_input_grad_ = false;     // chained: the input gradient goes back through the ReLU that made x
  Tensor input_;                     // x, when mask_input_grad_ (the earlier block's out_)
  Tensor out_, grad_sum_, grad_input_;
};

// The widths of the four stages: width, 2 width, 4 width, 8 width.
inline constexpr int kResnetStages = 4;

// The parameterised layers of resnet18 for samples [channels, height, width] (any size of at
// least 1x1), their parameters named and shaped as built; nothing allocated.
std::vector<LayerSize> plan_resnet18(int64_t width, const Shape& sample_shape, int num_classes);

// The model; convolutions and fc drawn from rng in forward order (PyTorch's default
// initialisation), BatchNorm weight 1 and bias 0. Only its children [begin, end) (Note [ResNet
// pipeline stages]): the others are not built, the draws of those before `begin` skipped.
std::unique_ptr<Sequential> build_resnet18(int64_t width, const Shape& sample_shape, int num_classes, Device device,
                                           InitRng& rng, size_t begin = 0, size_t end = SIZE_MAX);

}  // namespace dtrain
