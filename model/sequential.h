// Sequential: runs children in order; backward in reverse. Parameter and buffer names are
// prefixed with the child's index ("0.weight"), or with the name it was added under
// ("conv1.weight", as PyTorch's Sequential built from an OrderedDict).
#pragma once

#include <memory>
#include <vector>

#include "model/module.h"

namespace dtrain {

class Sequential : public Module {
 public:
  Sequential() = default;
  // Layers taken from another Sequential (a pipeline stage: Note [Pipeline partition] in
  // pipeline/partition.h), kept as they are: named and fused there, so a stage's parameters keep
  // the unsplit model's names ("3.weight").
  static std::unique_ptr<Sequential> of_named_layers(std::vector<std::unique_ptr<Module>> layers);
  // Gives up every layer (this Sequential is then empty).
  std::vector<std::unique_ptr<Module>> release_layers();
  Module& layer(size_t i) { return *layers_.at(i); }
  Sequential& add(std::unique_ptr<Module> layer);
  Sequential& add(const std::string& name, std::unique_ptr<Module> layer);
  template <class M, class... Args>
  Sequential& emplace(Args&&... args) {
    return add(std::make_unique<M>(std::forward<Args>(args)...));
  }

  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& grad_output, bool need_input_grad = true) override;
  std::vector<Parameter*> parameters() override;
  std::vector<Buffer*> buffers() override;
  std::vector<uint64_t*> rng_counters() override;
  void set_training(bool training) override;
  void set_amp(AmpMode mode) override;
  void set_grad_ready_hook(GradReadyHook hook) override;
  void set_batch_stats_sync(std::shared_ptr<BatchStatsSync> sync) override;
  std::string describe() const override;
  size_t size() const { return layers_.size(); }

 private:
  std::vector<std::unique_ptr<Module>> layers_;
};

}  // namespace dtrain
