// Note [Flat store]: values and gradients are views of one index space, a relayout keeps every
// value, gradient and optimizer state, and the fused step (one launch per run) computes the bits
// of one optimizer per parameter. Owned ranges (ZeRO's shards) update only their part, and their
// state round-trips through slice entries.
#include <cstring>
#include <memory>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/flat_store.h"
#include "model/optimizer.h"

namespace dtrain {
namespace {

// Parameters of an MLP's shapes (matrices and biases), filled from a seed.
struct Params {
  std::vector<std::unique_ptr<Parameter>> owned;
  explicit Params(uint64_t seed, std::vector<Shape> shapes = {{5, 7}, {5}, {3, 5}, {3}}) {
    std::mt19937 gen(static_cast<uint32_t>(seed));
    std::normal_distribution<float> d;
    for (size_t k = 0; k < shapes.size(); ++k) {
      const int64_t n = shape_numel(shapes[k]);
      std::vector<float> v(n);
      for (float& x : v) x = d(gen);
      owned.push_back(std::make_unique<Parameter>(
          Parameter{std::to_string(k / 2) + (k % 2 ? ".bias" : ".weight"), Tensor::from_vector(v, shapes[k]),
                    Tensor::zeros(shapes[k])}));
    }
  }
  std::vector<Parameter*> list() const {
    std::vector<Parameter*> out;
    for (auto& p : owned) out.push_back(p.get());
    return out;
  }
  // The same pseudo-gradient for step `s` whatever the layout; parameter `skip` gets none.
  void set_grads(int s, int skip = -1) {
    for (size_t k = 0; k < owned.size(); ++k) {
      Parameter& p = *owned[k];
      if (static_cast<int>(k) == skip) {
        p.grad_is_zero = true;
        continue;
      }
      std::vector<float> g(p.value.numel());
      for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.37f * float(i + 1) * float(s + 1) + float(k));
      p.grad.copy_from(Tensor::from_vector(g, p.value.shape()));
      p.grad_is_zero = false;
    }
  }
};

std::unique_ptr<Optimizer> make(OptimizerKind kind, std::vector<Parameter*> params, bool matrices_only) {
  OptimizerSpec spec;
  spec.kind = kind;
  spec.lr = 0.05f;
  spec.weight_decay = 0.1f;
  spec.decay_matrices_only = matrices_only;
  return make_optimizer(spec, std::move(params));
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

TEST(FlatStore, ValuesAndGradsAreViewsIntoOneIndexSpace) {
  Params ps(1);
  std::shared_ptr<FlatStore> store = FlatStore::of(ps.list());
  EXPECT_EQ(FlatStore::of(ps.list()), store);  // DDP and the optimizer find the same store
  for (size_t i = 0; i < ps.owned.size(); ++i) {
    Parameter& p = *ps.owned[i];
    EXPECT_TRUE(p.value.shares_storage(store->values()));
    EXPECT_TRUE(p.grad.shares_storage(store->grads()));
    EXPECT_EQ(p.value.data(), store->values().data() + store->offset(i));
    EXPECT_EQ(p.grad.data(), store->grads().data() + store->offset(i));
  }
}

// A store over another list (a subset, another order) would move the parameters out of DDP's
// store without a word, and their gradients would no longer be reduced: one line instead.
TEST(FlatStore, AParameterOfAnotherStoreIsRefusedNotMoved) {
  Params ps(1);
  std::shared_ptr<FlatStore> store = FlatStore::of(ps.list());
  const float* before = ps.owned[0]->value.data();
  std::vector<Parameter*> subset = {ps.owned[0].get(), ps.owned[1].get()};
  try {
    FlatStore::of(subset);
    FAIL() << "a subset of a store's parameters got a store of its own";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'0.weight' already belongs to a flat store of 4 parameter(s)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(ps.owned[0]->value.data(), before);
  EXPECT_EQ(ps.owned[0]->store, store);
}

TEST(FlatStore, FusedStepIsOneLaunchAndEqualsOneOptimizerPerParameterBitwise) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    for (bool matrices_only : {false, true}) {
      Params fused(2), single(2);
      std::unique_ptr<Optimizer> opt = make(kind, fused.list(), matrices_only);
      std::vector<std::unique_ptr<Optimizer>> one_each;  // the per-parameter launches of before
      for (auto& p : single.owned) one_each.push_back(make(kind, {p.get()}, matrices_only));
      for (int s = 0; s < 4; ++s) {
        const int skip = s == 1 ? 2 : -1;  // a parameter without a gradient in step 2
        fused.set_grads(s, skip);
        single.set_grads(s, skip);
        const int64_t before = opt->launches();
        opt->step();
        for (auto& o : one_each) o->step();
        // One run, unless weight decay differs between neighbours (afterwards the skipped
        // parameter's step count differs from its neighbours': runs of their own).
        if (s == 0) {
          EXPECT_EQ(opt->launches() - before, matrices_only ? 4 : 1);
        }
      }
      for (size_t k = 0; k < fused.owned.size(); ++k)
        EXPECT_TRUE(bitwise_equal(fused.owned[k]->value, single.owned[k]->value))
            << optimizer_name(kind) << " matrices_only=" << matrices_only << " parameter " << k;
    }
  }
}

TEST(FlatStore, RelayoutKeepsValuesGradientsAndOptimizerState) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    Params moved(3), kept(3);
    std::unique_ptr<Optimizer> a = make(kind, moved.list(), false), b = make(kind, kept.list(), false);
    for (int s = 0; s < 5; ++s) {
      moved.set_grads(s);
      kept.set_grads(s);
      if (s == 2) {  // between a backward and its step, as a bucket rebuild
        FlatStore& store = a->store();
        store.lay_out({0, 40, 48, 70}, 100);  // another order, other gaps
      }
      a->step();
      b->step();
    }
    for (size_t k = 0; k < moved.owned.size(); ++k)
      EXPECT_TRUE(bitwise_equal(moved.owned[k]->value, kept.owned[k]->value)) << optimizer_name(kind) << " " << k;
  }
}

// ZeRO lays the values out in the communicator's buffer (FlatStore::lay_out's value_storage),
// and a rebuild lays them out again in that same buffer: every value is kept, through a copy.
// The optimizer reports each owned range once it is updated (FlatStore::after_range), in order.
TEST(FlatStore, RelayoutIntoTheSameValueBufferKeepsValuesAndRangesAreReportedInOrder) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    Params moved(3), kept(3);
    std::unique_ptr<Optimizer> a = make(kind, moved.list(), false), b = make(kind, kept.list(), false);
    Tensor buffer = Tensor::empty({128});
    FlatStore& store = a->store();
    store.lay_out(store.offsets(), store.size(), {}, {{0, 40}, {40, store.size()}}, buffer);
    EXPECT_TRUE(store.values().shares_storage(buffer));
    std::vector<size_t> reported;
    std::vector<float> first_value_at_report;
    store.set_after_range([&](size_t k) {
      reported.push_back(k);
      first_value_at_report.push_back(store.values().slice(store.owned()[k].begin, {1}).to_vector()[0]);
    });
    for (int s = 0; s < 4; ++s) {
      moved.set_grads(s);
      kept.set_grads(s);
      if (s == 2) store.lay_out({0, 40, 48, 70}, 100, {}, {{0, 48}, {48, 100}}, buffer);  // the same buffer
      reported.clear();
      first_value_at_report.clear();
      a->step();
      b->step();
      EXPECT_EQ(reported, (std::vector<size_t>{0, 1})) << optimizer_name(kind) << " step " << s;
      // Each range was updated when reported: its first value is the final one.
      for (size_t k = 0; k < reported.size(); ++k)
        EXPECT_EQ(first_value_at_report[k], store.values().slice(store.owned()[k].begin, {1}).to_vector()[0])
            << "range " << k;
    }
    for (size_t k = 0; k < moved.owned.size(); ++k)
      EXPECT_TRUE(bitwise_equal(moved.owned[k]->value, kept.owned[k]->value)) << optimizer_name(kind) << " " << k;
  }
}

// Two "ranks" each own half of the space (ranges cutting parameters in two), each steps its half
// of the same values; their halves together equal the unsharded step, and their slice entries
// load into an unsharded optimizer that then continues as the unsharded one.
TEST(FlatStore, OwnedRangesStepTheirPartAndExportSlicesThatReassemble) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    Params whole(4), r0(4), r1(4);
    std::unique_ptr<Optimizer> w = make(kind, whole.list(), false);
    const int64_t size = w->store().size();
    const std::vector<int64_t> offsets = w->store().offsets();
    std::unique_ptr<Optimizer> o0 = make(kind, r0.list(), false), o1 = make(kind, r1.list(), false);
    const int64_t cut = 60;  // inside parameter "0.weight" (35 elements from 48)
    o0->store().lay_out(offsets, size, {}, {{0, cut}});
    o1->store().lay_out(offsets, size, {}, {{cut, size}});
    for (int s = 0; s < 3; ++s) {
      whole.set_grads(s);
      r0.set_grads(s);
      r1.set_grads(s);
      w->step();
      o0->step();
      o1->step();
      // The "all-gather": each takes the other's part.
      Tensor& v0 = o0->store().values();
      Tensor& v1 = o1->store().values();
      v0.slice(cut, {size - cut}).copy_from(v1.slice(cut, {size - cut}));
      v1.slice(0, {cut}).copy_from(v0.slice(0, {cut}));
    }
    EXPECT_LT(o0->state_bytes() + o1->state_bytes(), 2 * w->state_bytes() + 64);
    for (size_t k = 0; k < whole.owned.size(); ++k)
      EXPECT_TRUE(bitwise_equal(whole.owned[k]->value, r0.owned[k]->value)) << optimizer_name(kind) << " " << k;

    OptimizerState merged = o0->export_state();
    OptimizerState other = o1->export_state();
    bool sliced = false;
    for (auto& e : merged.tensors) sliced |= e.is_slice();
    EXPECT_TRUE(sliced);
    merged.tensors.insert(merged.tensors.end(), other.tensors.begin(), other.tensors.end());
    std::set<std::string> names;
    std::vector<OptimizerState::Count> counts;
    for (auto& c : merged.counts)
      if (names.insert(c.name).second) counts.push_back(c);
    for (auto& c : other.counts)
      if (names.insert(c.name).second) counts.push_back(c);
    merged.counts = counts;
    Params resumed(99);
    for (size_t k = 0; k < resumed.owned.size(); ++k) resumed.owned[k]->value.copy_from(whole.owned[k]->value);
    std::unique_ptr<Optimizer> r = make(kind, resumed.list(), false);
    r->import_state(merged);
    whole.set_grads(7);
    resumed.set_grads(7);
    w->step();
    r->step();
    for (size_t k = 0; k < whole.owned.size(); ++k)
      EXPECT_TRUE(bitwise_equal(whole.owned[k]->value, resumed.owned[k]->value)) << optimizer_name(kind) << " " << k;

    // One rank's slices alone do not cover a whole parameter: refused, naming it.
    Params fresh(5);
    std::unique_ptr<Optimizer> r2 = make(kind, fresh.list(), false);
    try {
      r2->import_state(o0->export_state());
      ADD_FAILURE() << "a partial state was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("does not cover elements [12, 35)"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dtrain
