#include "app/train_step.h"

#include "core/ops.h"

namespace dtrain {

Tensor forward_backward(Module& model, DistributedDataParallel* ddp, CrossEntropyLoss& loss_fn, Tracer& tracer,
                        const Tensor& input, const Tensor& targets, const MicroStep& micro) {
  Tensor logits;
  {
    ScopedSpan span(&tracer, "forward");
    logits = model.forward(input);
  }
  Tensor loss = loss_fn.forward(logits, targets);
  Tensor grad = loss_fn.backward();
  // The step sees the mean over its micro-batches.
  if (micro.step_size > 1) scale(grad, 1.f / static_cast<float>(micro.step_size));
  if (!ddp) {
    ScopedSpan span(&tracer, "backward");
    model.backward(grad, false);
  } else if (micro.ends_step) {
    ddp->backward(grad);
    tracer.add_backward(ddp->last_backward());
  } else {
    auto guard = ddp->no_sync();
    ScopedSpan span(&tracer, "backward (no_sync)");
    ddp->backward(grad);
  }
  return loss;
}

}  // namespace dtrain
