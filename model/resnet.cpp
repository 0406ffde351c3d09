#include "model/resnet.h"

#include <fmt/format.h>

#include "core/error.h"
#include "model/linear.h"
#include "model/models.h"
#include "model/norm_kernels.h"

namespace dtrain {

BasicBlock::BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride, Device device, InitRng& rng)
    : in_c_(in_channels),
      out_c_(out_channels),
      stride_(stride),
      conv1_(in_channels, out_channels, 3, stride, 1, device, rng, false),
      bn1_(out_channels, 2, device),
      conv2_(out_channels, out_channels, 3, 1, 1, device, rng, false),
      bn2_(out_channels, 2, device) {
  bn1_.absorb_following_relu();
  prefix_names(conv1_, "conv1");
  prefix_names(bn1_, "bn1");
  prefix_names(conv2_, "conv2");
  prefix_names(bn2_, "bn2");
  if (stride != 1 || in_channels != out_channels) {
    downsample_ = std::make_unique<Sequential>();
    downsample_->emplace<Conv2d>(in_channels, out_channels, 1, stride, 0, device, rng, false);
    downsample_->emplace<BatchNorm>(out_channels, 2, device);
    prefix_names(*downsample_, "downsample");
  }
}

std::vector<Module*> BasicBlock::children() {
  std::vector<Module*> out = {&conv1_, &bn1_, &conv2_, &bn2_};
  if (downsample_) out.push_back(downsample_.get());
  return out;
}

// Per call: the two convolutions and BatchNorms (the downsample's too), one pass for the join.
// Note [Fused residual join]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The join ReLU(bn2(h) + identity) is bn2's normalising pass with the identity added before its
// ReLU (kernels::BatchNormApplyPlanes' residual): one pass over the block's output instead of
// bn2's and then AddRelu's, the same floats. bn2's output is the block's: backward masks the
// gradient with it (bn2 itself, without a ReLU of its own, reads only its input in backward).
Tensor BasicBlock::forward(const Tensor& x) {
  const Tensor& h = conv2_.forward(bn1_.forward(conv1_.forward(x)));
  const Tensor& identity = downsample_ ? downsample_->forward(x) : x;
  DTRAIN_CHECK(h.shape() == identity.shape(), "BasicBlock: {} and identity {}", shape_str(h.shape()),
               shape_str(identity.shape()));
  out_ = bn2_.forward_add_relu(h, identity);
  if (mask_input_grad_) input_ = x;
  return out_;
}

// Note [Chained joins]
// ~~~~~~~~~~~~~~~~~~~~
// Each block's backward starts with its join's ReLU (ReluBackward by out_: a pass reading two
// arrays and writing one) and ends adding its branches' input gradients (Add). In
// build_resnet18 a block's input is the previous block's out_, so the later block can apply the
// earlier one's ReLU mask in its Add (AddMasked by x = the earlier out_) and the earlier one
// skips its ReluBackward: out_ > 0 ? (x > 0 ? v : 0) : 0 is x > 0 ? v : 0, the same floats, one
// pass over every block output fewer. chain() sets both halves together: the later's alone
// would apply the ReLU twice (the pass not saved), the earlier's alone would leave it out. A
// pipeline cut between two blocks (Note [ResNet pipeline stages]) keeps the chain: the later
// stage's first block masks by its input, the earlier stage's output, which the earlier stage's
// last block leaves unmasked; each stage's build sets its own half.
void BasicBlock::chain(BasicBlock* earlier, BasicBlock* later) {
  if (earlier) earlier->grad_output_masked_ = true;
  if (later) later->mask_input_grad_ = true;
}

// The join's ReLU masks the gradient once; both branches take it; their input gradients add.
Tensor BasicBlock::backward(const Tensor& grad_output, bool need_input_grad) {
  const Device dev = out_.device();
  const Tensor* grad_sum = &grad_output;  // chained: masked already
  if (!grad_output_masked_) {
    ensure_tensor(grad_sum_, out_.shape(), dev);
    launch(dev, grad_sum_.numel(), kernels::ReluBackward{grad_sum_.data(), grad_output.data(), out_.data()});
    grad_sum = &grad_sum_;
  }
  const Tensor& g_main = conv1_.backward(bn1_.backward(conv2_.backward(bn2_.backward(*grad_sum))), need_input_grad);
  const Tensor g_other = downsample_ ? downsample_->backward(*grad_sum, need_input_grad) : *grad_sum;
  if (!need_input_grad) return {};
  ensure_tensor(grad_input_, g_main.shape(), dev);
  if (mask_input_grad_)
    launch(dev, grad_input_.numel(),
           kernels::AddMasked{grad_input_.data(), g_main.data(), g_other.data(), input_.data()});
  else
    launch(dev, grad_input_.numel(), kernels::Add{grad_input_.data(), g_main.data(), g_other.data()});
  return grad_input_;
}

std::vector<Parameter*> BasicBlock::parameters() {
  std::vector<Parameter*> out;
  for (Module* m : children())
    for (Parameter* p : m->parameters()) out.push_back(p);
  return out;
}

std::vector<Buffer*> BasicBlock::buffers() {
  std::vector<Buffer*> out;
  for (Module* m : children())
    for (Buffer* b : m->buffers()) out.push_back(b);
  return out;
}

void BasicBlock::set_training(bool training) {
  Module::set_training(training);
  for (Module* m : children()) m->set_training(training);
}

void BasicBlock::set_amp(AmpMode mode) {
  for (Module* m : children()) m->set_amp(mode);
}

void BasicBlock::set_grad_ready_hook(GradReadyHook hook) {
  for (Module* m : children()) m->set_grad_ready_hook(hook);
  Module::set_grad_ready_hook(std::move(hook));
}

void BasicBlock::set_batch_stats_sync(std::shared_ptr<BatchStatsSync> sync) {
  for (Module* m : children()) m->set_batch_stats_sync(sync);
}

std::string BasicBlock::describe() const {
  return fmt::format("BasicBlock({}, {}, stride={})", in_c_, out_c_, stride_);
}

namespace {

LayerSize conv_layer(const std::string& name, int64_t in_c, int64_t out_c, int64_t k) {
  const int64_t n = checked_mul(checked_mul(in_c, out_c, name), k * k, name);
  return {fmt::format("Conv2d({}, {}, kernel={}, bias=False)", in_c, out_c, k), n, {{name + ".weight", {out_c, in_c, k, k}}}};
}

LayerSize bn_layer(const std::string& name, int64_t c) {
  return {fmt::format("BatchNorm2d({})", c), 2 * c, {{name + ".weight", {c}}, {name + ".bias", {c}}}, 0,
          {{name + ".running_mean", {c}}, {name + ".running_var", {c}}, {name + ".num_batches_tracked", {}, DType::kI64}}};
}

void check_resnet(int64_t width, const Shape& sample_shape, int num_classes) {
  if (sample_shape.size() != 3 || sample_shape[0] < 1 || sample_shape[1] < 1 || sample_shape[2] < 1)
    throw Error(fmt::format("resnet18 expects samples of shape [channels, height, width], got {}",
                            shape_str(sample_shape)),
                ErrorKind::kUsage);
  if (width < 1 || width > (int64_t{1} << 20))
    throw Error(fmt::format("resnet18 width {} is not in [1, 2^20]", width), ErrorKind::kUsage);
  if (num_classes < 1)
    throw Error(fmt::format("resnet18 needs at least one class, got {}", num_classes), ErrorKind::kUsage);
}

}  // namespace

std::vector<LayerSize> plan_resnet18(int64_t width, const Shape& sample_shape, int num_classes) {
  check_resnet(width, sample_shape, num_classes);
  // `index`: the place in build_resnet18's Sequential (conv1, bn1, layer1..layer4, avgpool, fc)
  // of the child that holds the tensor: where a pipeline may cut (Note [ResNet pipeline stages]).
  std::vector<LayerSize> layers = {conv_layer("conv1", sample_shape[0], width, 3), bn_layer("bn1", width)};
  layers[1].index = 1;
  int64_t in = width;
  for (int s = 0; s < kResnetStages; ++s) {
    const int64_t out = width << s;
    const size_t first = layers.size();
    for (int b = 0; b < 2; ++b) {
      const std::string block = fmt::format("layer{}.{}", s + 1, b);
      const int64_t cin = b == 0 ? in : out;
      layers.push_back(conv_layer(block + ".conv1", cin, out, 3));
      layers.push_back(bn_layer(block + ".bn1", out));
      layers.push_back(conv_layer(block + ".conv2", out, out, 3));
      layers.push_back(bn_layer(block + ".bn2", out));
      if (b == 0 && (s > 0 || cin != out)) {
        layers.push_back(conv_layer(block + ".downsample.0", cin, out, 1));
        layers.push_back(bn_layer(block + ".downsample.1", out));
      }
    }
    for (size_t i = first; i < layers.size(); ++i) layers[i].index = static_cast<size_t>(2 + s);
    in = out;
  }
  const int64_t features = width << (kResnetStages - 1);
  layers.push_back({fmt::format("Linear({}, {})", features, num_classes), checked_mul(features + 1, num_classes, "fc"),
                    {{"fc.weight", {num_classes, features}}, {"fc.bias", {num_classes}}}});
  layers.back().index = 3 + kResnetStages;  // after avgpool
  return layers;
}

std::unique_ptr<Sequential> build_resnet18(int64_t width, const Shape& sample_shape, int num_classes, Device device,
                                           InitRng& rng, size_t begin, size_t end) {
  check_resnet(width, sample_shape, num_classes);
  // The uniform draws of each child (by place: conv1, bn1, layer1..layer4, avgpool, fc): its
  // convolutions' and fc's parameters; BatchNorm's weight 1 and bias 0 draw none.
  std::vector<uint64_t> draws(4 + kResnetStages, 0);
  for (const LayerSize& l : plan_resnet18(width, sample_shape, num_classes))
    if (!l.layer.starts_with("BatchNorm")) draws[l.index] += static_cast<uint64_t>(l.parameters);
  auto model = std::make_unique<Sequential>();
  size_t place = 0;
  auto wanted = [&] { return place >= begin && place < end; };
  // Child `place`, built by `make` when wanted, else its draws skipped.
  auto child = [&](const std::string& name, auto make) {
    if (wanted()) model->add(name, make());
    else rng.skip(draws[place]);
    ++place;
  };
  child("conv1", [&] { return std::make_unique<Conv2d>(sample_shape[0], width, 3, 1, 1, device, rng, false); });
  child("bn1", [&] {
    auto bn1 = std::make_unique<BatchNorm>(width, 2, device);
    bn1->absorb_following_relu();
    return bn1;
  });
  int64_t in = width;
  BasicBlock* previous = nullptr;  // the block built last, while the next block is the one after it
  for (int s = 0; s < kResnetStages; ++s) {
    const int64_t out = width << s;
    child(fmt::format("layer{}", s + 1), [&] {
      auto stage = std::make_unique<Sequential>();
      for (int b = 0; b < 2; ++b) {
        auto block = std::make_unique<BasicBlock>(b == 0 ? in : out, out, s > 0 && b == 0 ? 2 : 1, device, rng);
        // Note [Chained joins]: every block but the whole model's first; `previous` null when the
        // block before is an earlier pipeline stage's.
        if (s > 0 || b > 0) BasicBlock::chain(previous, block.get());
        previous = block.get();
        stage->add(std::move(block));
      }
      return stage;
    });
    if (place > end) {  // this residual stage is a later pipeline stage's: its first block chains to `previous`
      BasicBlock::chain(previous, nullptr);
      previous = nullptr;
    }
    in = out;
  }
  child("avgpool", [] { return std::make_unique<GlobalAvgPool>(); });
  child("fc", [&] { return std::make_unique<Linear>(in, num_classes, device, rng); });
  return model;
}

}  // namespace dtrain
