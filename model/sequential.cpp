#include "model/sequential.h"

#include <utility>

#include <fmt/format.h>

namespace dtrain {

Sequential& Sequential::add(std::unique_ptr<Module> layer) { return add(std::to_string(layers_.size()), std::move(layer)); }

Sequential& Sequential::add(const std::string& name, std::unique_ptr<Module> layer) {
  // Children are named "<name>.<local name>" once, here; names are stable for the module's life.
  prefix_names(*layer, name);
  if (!layers_.empty()) layer->fuse_into(*layers_.back());  // Note [Fused ReLU]
  layers_.push_back(std::move(layer));
  return *this;
}

std::unique_ptr<Sequential> Sequential::of_named_layers(std::vector<std::unique_ptr<Module>> layers) {
  auto out = std::make_unique<Sequential>();
  out->layers_ = std::move(layers);
  return out;
}

std::vector<std::unique_ptr<Module>> Sequential::release_layers() { return std::exchange(layers_, {}); }

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (auto& layer : layers_) x = layer->forward(x);
  return x;
}

Tensor Sequential::backward(const Tensor& grad_output, bool need_input_grad) {
  // When the input needs no gradient, backward ends at the first layer with parameters: the
  // parameter-free layers before it (Flatten in the MLP) would only feed a gradient nobody
  // reads, and that first layer skips its input-gradient GEMM (a third of the MLP's work).
  size_t stop = 0;
  if (!need_input_grad)
    while (stop < layers_.size() && layers_[stop]->parameters().empty()) ++stop;
  Tensor g = grad_output;
  for (size_t i = layers_.size(); i-- > stop;) g = layers_[i]->backward(g, need_input_grad || i > stop);
  return need_input_grad ? g : Tensor{};
}

std::vector<Parameter*> Sequential::parameters() {
  std::vector<Parameter*> out;
  for (auto& layer : layers_)
    for (Parameter* p : layer->parameters()) out.push_back(p);
  return out;
}

std::vector<Buffer*> Sequential::buffers() {
  std::vector<Buffer*> out;
  for (auto& layer : layers_)
    for (Buffer* b : layer->buffers()) out.push_back(b);
  return out;
}

std::vector<uint64_t*> Sequential::rng_counters() {
  std::vector<uint64_t*> out;
  for (auto& layer : layers_)
    for (uint64_t* c : layer->rng_counters()) out.push_back(c);
  return out;
}

void Sequential::set_training(bool training) {
  Module::set_training(training);
  for (auto& layer : layers_) layer->set_training(training);
}

void Sequential::set_amp(AmpMode mode) {
  for (auto& layer : layers_) layer->set_amp(mode);
}

void Sequential::set_grad_ready_hook(GradReadyHook hook) {
  for (auto& layer : layers_) layer->set_grad_ready_hook(hook);
  Module::set_grad_ready_hook(std::move(hook));
}

void Sequential::set_batch_stats_sync(std::shared_ptr<BatchStatsSync> sync) {
  for (auto& layer : layers_) layer->set_batch_stats_sync(sync);
}

std::string Sequential::describe() const {
  std::string s = "Sequential(";
  for (size_t i = 0; i < layers_.size(); ++i) s += (i ? ", " : "") + layers_[i]->describe();
  return s + ")";
}

}  // namespace dtrain
