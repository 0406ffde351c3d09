#include "app/evaluate.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "app/batch_stager.h"
#include "app/lm_batches.h"
#include "data/data_loader.h"
#include "model/loss.h"

namespace dtrain {

Evaluation evaluate(Module& model, const Dataset& data, Communicator& control, Device device) {
  std::vector<int64_t> shard;
  for (int64_t i = control.rank(); i < data.size(); i += control.size()) shard.push_back(i);
  DataLoader loader(data, 1000);
  loader.start_epoch(std::move(shard));
  model.set_training(false);
  CrossEntropyLoss loss_fn(Reduction::kSum);
  BatchStager stager(device);
  double totals[3] = {0, 0, 0};  // loss sum, correct, count
  for (StagedBatches batches(loader, stager); batches.next();) {
    Tensor logits = model.forward(batches.images());
    totals[0] += loss_value(loss_fn.forward(logits, batches.labels()));
    totals[1] += static_cast<double>(count_correct(logits, batches.labels()));
    totals[2] += static_cast<double>(batches.labels().numel());
  }
  model.set_training(true);
  float sums[3] = {static_cast<float>(totals[0]), static_cast<float>(totals[1]), static_cast<float>(totals[2])};
  control.allreduce(sums, 3, DType::kF32, ReduceOp::kSum);
  const float count = std::max(sums[2], 1.f);
  return {sums[0] / count, sums[1] / count, static_cast<int64_t>(sums[2])};
}

double lm_validation_loss(Module& model, LmBatches& data, int64_t batches, Communicator& control) {
  model.set_training(false);
  CrossEntropyLoss mean_loss;
  double sum = 0;
  for (int64_t i = control.rank(); i < batches; i += control.size()) {
    data.stage_val(i);
    sum += loss_value(mean_loss.forward(model.forward(data.inputs()), data.targets()));
  }
  model.set_training(true);
  float total = static_cast<float>(sum);  // at most `batches` terms: float is plenty
  control.allreduce(&total, 1, DType::kF32, ReduceOp::kSum);
  return static_cast<double>(total) / static_cast<double>(batches);
}

std::string test_set_line(const Evaluation& eval, int64_t test_size) {
  return fmt::format("Test set: Average loss: {:.4f}, Accuracy: {:.0f}/{} ({:.2f}%)", eval.loss,
                     eval.accuracy * static_cast<double>(test_size), test_size, 100.0 * eval.accuracy);
}

}  // namespace dtrain
