#include "model/grad_clip.h"

#include <algorithm>

#include "core/ops.h"
#include "model/flat_store.h"
#include "model/grad_clip_kernels.h"
#include "model/kernels.h"

namespace dtrain {

int64_t grad_norm_chunks(int64_t n) {
  constexpr int64_t kElementsPerChunk = 1024;
  return std::max<int64_t>(1, (n + kElementsPerChunk - 1) / kElementsPerChunk);
}

GradNormClipper::GradNormClipper(std::vector<Parameter*> params, std::function<float(float)> sum_over_ranks,
                                 bool params_are_a_part, std::vector<const Parameter*> copies)
    : params_(std::move(params)),
      sum_over_ranks_(std::move(sum_over_ranks)),
      part_(params_are_a_part),
      copies_(std::move(copies)) {
  DTRAIN_CHECK(!part_ || sum_over_ranks_, "clipping a part of a model needs the sum over ranks");
  DTRAIN_CHECK(!params_.empty(), "gradient clipping needs parameters");
  const Device device = params_[0]->value.device();
  result_ = Tensor::zeros({2}, device);
  if (params_[0]->store && params_[0]->store->grads_sharded()) {
    DTRAIN_CHECK(sum_over_ranks_, "clipping sharded gradients needs the sum over ranks");
    return;  // sized at each clip: a bucket rebuild re-cuts the owned gradients
  }
  int64_t total = 0;
  for (const Parameter* p : params_) {
    first_partial_.push_back(total);
    chunks_.push_back(grad_norm_chunks(p->grad.numel()));
    total += chunks_.back();
  }
  partials_ = Tensor::zeros({total}, device);
  const int64_t groups = (total + kernels::kNormGroup - 1) / kernels::kNormGroup;
  DTRAIN_CHECK(!part_ || groups <= kernels::kNormGroup, "{} gradient chunks per stage: too many to clip", total);
  group_sums_ = Tensor::zeros({groups + (part_ ? 1 : 0)}, device);  // a part: its total in the last element
}

void GradNormClipper::add_parts_sums(int64_t groups) {
  // This rank's sum of squares (one group of groups), added over the ranks through the host.
  const Device device = result_.device();
  launch(device, 1, kernels::SumGroups{group_sums_.data() + groups, group_sums_.data(), groups});
  Tensor mine = group_sums_.slice(groups, {1});
  const float total = sum_over_ranks_(mine.to_vector()[0]);
  mine.copy_from(Tensor::from_vector(std::vector<float>{total}, {1}, device));
}

namespace {

// `spans` less the elements of the store's parameters in `copies` (a tied weight's second copy,
// counted by another rank's part): what the sum of squares reads.
std::vector<GradSpan> without_copies(std::vector<GradSpan> spans, FlatStore& store,
                                     const std::vector<const Parameter*>& copies) {
  DTRAIN_CHECK(copies.empty() || !store.grads_lent(), "a tied copy's gradient lent out (ZeRO-2's ring)");
  for (const Parameter* copy : copies) {
    const auto& params = store.params();
    const auto at = std::find(params.begin(), params.end(), copy);
    DTRAIN_CHECK(at != params.end(), "the tied copy {} is not in the clipped store", copy->name);
    const float* lo = store.grads().data() + store.offset(static_cast<size_t>(at - params.begin()));
    const float* hi = lo + copy->grad.numel();
    std::vector<GradSpan> kept;
    for (const GradSpan& s : spans) {
      const float* b = s.data;
      const float* e = s.data + s.n;
      if (b < lo) kept.push_back({s.data, std::min(e, lo) - b});
      if (e > hi) kept.push_back({const_cast<float*>(std::max(b, hi)), e - std::max(b, hi)});
    }
    spans = std::move(kept);
  }
  return spans;
}

}  // namespace

void GradNormClipper::clip_owned(float max_norm) {
  const Device device = result_.device();
  const std::vector<GradSpan> spans = params_[0]->store->owned_grad_spans();
  // Only these are summed; every owned span is scaled (Note [Tied stages] in pipeline_stage.h).
  const std::vector<GradSpan> summed = without_copies(spans, *params_[0]->store, copies_);
  int64_t chunks = 0;
  for (const GradSpan& s : summed) chunks += grad_norm_chunks(s.n);
  const int64_t groups = (chunks + kernels::kNormGroup - 1) / kernels::kNormGroup;
  DTRAIN_CHECK(groups <= kernels::kNormGroup, "{} gradient chunks per rank: too many to clip", chunks);
  ensure_tensor(partials_, {std::max<int64_t>(chunks, 1)}, device);
  ensure_tensor(group_sums_, {groups + 1}, device);
  fill(partials_, 0.f);  // (a rank that owns nothing)
  int64_t at = 0;
  for (const GradSpan& s : summed) {
    const int64_t c = grad_norm_chunks(s.n);
    launch(device, c, kernels::SumSquaresStrided{partials_.data() + at, s.data, s.n, c});
    at += c;
  }
  launch(device, groups, kernels::SumGroups{group_sums_.data(), partials_.data(), partials_.numel()});
  // This rank's sum of squares, in the last element (groups <= kNormGroup: one group of groups).
  add_parts_sums(groups);
  launch(device, 1, kernels::GlobalNormAndClipCoefficient{result_.data(), group_sums_.data() + groups, 1, max_norm});
  if (max_norm > 0.f)
    for (const GradSpan& s : spans) launch(device, s.n, kernels::ScaleByDeviceScalar{s.data, result_.data() + 1});
}

bool GradNormClipper::flat_path() const {
  const FlatStore* store = params_[0]->store.get();
  if (!store || store->grads_sharded() || store->params() != params_ || !copies_.empty()) return false;
  const Tensor& grads = const_cast<FlatStore*>(store)->grads();
  if (!grads.defined()) return false;
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i]->grad_is_zero || params_[i]->grad.data() != grads.data() + store->offset(i)) return false;
  return true;
}

void GradNormClipper::upload_spans() {
  const FlatStore& store = *params_[0]->store;
  if (span_table_version_ == store.version()) return;
  const size_t n = params_.size();
  std::vector<int64_t> table(3 * n + 1);
  for (size_t i = 0; i < n; ++i) {
    table[i] = store.offset(i);
    table[n + i] = params_[i]->grad.numel();
    table[2 * n + i] = first_partial_[i];  // the per-parameter path's chunks: the same bits
  }
  table[3 * n] = partials_.numel();
  Tensor host = Tensor::empty({static_cast<int64_t>(table.size() * sizeof(int64_t))}, Device::cpu(), DType::kU8);
  std::copy(table.begin(), table.end(), host.data_as<int64_t>());
  span_table_ = host.to(result_.device());
  span_table_version_ = store.version();
}

void GradNormClipper::clip(float max_norm) {
  if (params_[0]->store && params_[0]->store->grads_sharded()) return clip_owned(max_norm);
  const Device device = result_.device();
  const bool flat = flat_path();
  if (flat) {
    upload_spans();
    const int64_t* t = span_table_.data_as<int64_t>();
    const int64_t n = static_cast<int64_t>(params_.size());
    launch(device, partials_.numel(),
           kernels::SumSquaresSpans{partials_.data(), params_[0]->store->grads().data(), t, t + n, t + 2 * n, n});
    ++launches_;
  } else {
    fill(partials_, 0.f);  // absent gradients contribute nothing
    for (size_t i = 0; i < params_.size(); ++i) {
      Parameter& p = *params_[i];
      if (p.grad_is_zero || std::find(copies_.begin(), copies_.end(), &p) != copies_.end()) continue;
      launch(device, chunks_[i],
             kernels::SumSquaresStrided{partials_.data() + first_partial_[i], p.grad.data(), p.grad.numel(), chunks_[i]});
      ++launches_;
    }
  }
  const int64_t groups = group_sums_.numel() - (part_ ? 1 : 0);
  launch(device, groups, kernels::SumGroups{group_sums_.data(), partials_.data(), partials_.numel()});
  if (part_) add_parts_sums(groups);
  launch(device, 1,
         part_ ? kernels::GlobalNormAndClipCoefficient{result_.data(), group_sums_.data() + groups, 1, max_norm}
               : kernels::GlobalNormAndClipCoefficient{result_.data(), group_sums_.data(), groups, max_norm});
  launches_ += 2;
  if (max_norm <= 0.f) return;
  // Scaled even when the coefficient is 1 (x * 1 is x, bit for bit): the host never looks. The
  // flat gradient's gaps are zeros, and the coefficient is in [0, 1]: they stay zero.
  if (flat) {
    Tensor& grads = params_[0]->store->grads();
    launch(device, params_[0]->store->size(), kernels::ScaleByDeviceScalar{grads.data(), result_.data() + 1});
    ++launches_;
    return;
  }
  for (Parameter* p : params_)
    if (!p->grad_is_zero) {
      launch(device, p->grad.numel(), kernels::ScaleByDeviceScalar{p->grad.data(), result_.data() + 1});
      ++launches_;
    }
}

float GradNormClipper::last_norm() const { return result_.to_vector()[0]; }

}  // namespace dtrain
