// The built-in models: the cnn sized from the image it is given (or refused by name), the layer
// plan that tells the truth about what is built, and the memory check that refuses a model
// before allocating it.
#include "model/models.h"

#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/memory.h"
#include "gradcheck.h"

namespace dtrain {
namespace {

using ::testing::HasSubstr;
using testing::random_values;

std::string build_error(const ModelSpec& spec, const Shape& sample, int classes) {
  try {
    build_model(spec, sample, classes, Device::cpu(), 0);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The kind of build_model's error (kFailure when none): a model that cannot take the data's
// samples is a setting the same command line repeats (2), not a failure a restart may fix (1).
ErrorKind build_error_kind(const ModelSpec& spec, const Shape& sample, int classes) {
  try {
    build_model(spec, sample, classes, Device::cpu(), 0);
  } catch (const Error& e) {
    return e.kind();
  }
  return ErrorKind::kFailure;
}

int64_t parameter_count(Sequential& model) {
  int64_t n = 0;
  for (Parameter* p : model.parameters()) n += p->value.numel();
  return n;
}

int64_t planned_count(const ModelSpec& spec, const Shape& sample, int classes) {
  int64_t n = 0;
  for (const LayerSize& l : plan_model(spec, sample, classes)) n += l.parameters;
  return n;
}

// The plan names and shapes every parameter as the built model does, so a weights file can be
// checked against it before anything is allocated (dtrain eval, issue 19 item 9).
TEST(Models, PlanNamesAndShapesTheParametersAsBuilt) {
  for (ModelKind kind : {ModelKind::kMlp, ModelKind::kCnn})
    for (float dropout : {0.f, 0.25f}) {
      ModelSpec spec{kind, {32, 16}, dropout};
      const Shape sample = {1, 28, 28};
      auto model = build_model(spec, sample, 7, Device::cpu(), 0);
      std::vector<std::string> built, planned;
      for (Parameter* p : model->parameters()) built.push_back(p->name + " " + shape_str(p->value.shape()));
      for (const LayerSize& l : plan_model(spec, sample, 7))
        for (const ParameterShape& t : l.tensors) planned.push_back(t.name + " " + shape_str(t.shape));
      EXPECT_EQ(planned, built) << model_kind_name(kind) << " dropout " << dropout;
    }
}

// dropout_layer_places names the places of the layers that hold Dropout counters, as built, in the
// order the unsplit model lists its counters (Note [Pipeline dropout]: a stage takes its own back).
TEST(Models, DropoutPlacesAreTheBuiltDropoutLayers) {
  for (ModelKind kind : {ModelKind::kMlp, ModelKind::kCnn})
    for (float dropout : {0.f, 0.25f}) {
      ModelSpec spec{kind, {32, 16, 8}, dropout};
      const Shape sample = {1, 28, 28};
      std::vector<size_t> built;
      const size_t layers = layer_parameter_counts(spec, sample, 7).size();
      for (size_t i = 0; i < layers; ++i)
        if (!build_model(spec, sample, 7, Device::cpu(), 0, LayerRange{i, i + 1})->rng_counters().empty())
          built.push_back(i);
      EXPECT_EQ(dropout_layer_places(spec, sample, 7), built) << model_kind_name(kind) << " dropout " << dropout;
      EXPECT_EQ(built.size(), build_model(spec, sample, 7, Device::cpu(), 0)->rng_counters().size());
      EXPECT_EQ(built.empty(), dropout == 0.f);
    }
}

TEST(Models, CnnAdaptsToTheImageSize) {
  // 28x28 -> 16x5x5 (LeNet), 32x32 -> 16x6x6, 12x12 (the smallest) -> 16x1x1, 20x16 -> 16x3x2.
  const std::vector<std::pair<Shape, int64_t>> cases = {
      {{1, 28, 28}, 400}, {{3, 32, 32}, 576}, {{1, 12, 12}, 16}, {{2, 20, 16}, 96}};
  for (const auto& [sample, flat] : cases) {
    ModelSpec spec{ModelKind::kCnn};
    auto model = build_model(spec, sample, 7, Device::cpu(), 3);
    EXPECT_EQ(plan_model(spec, sample, 7)[2].layer, fmt::format("Linear({}, 120)", flat)) << shape_str(sample);
    Shape batch = {2};
    batch.insert(batch.end(), sample.begin(), sample.end());
    Tensor y = model->forward(Tensor::from_vector(random_values(static_cast<size_t>(shape_numel(batch)), 5), batch));
    EXPECT_EQ(y.shape(), (Shape{2, 7})) << shape_str(sample);
    EXPECT_EQ(parameter_count(*model), planned_count(spec, sample, 7)) << shape_str(sample);
  }
}

TEST(Models, CnnRefusesImagesItCannotTakeWithOneLine) {
  EXPECT_EQ(build_error(ModelSpec{ModelKind::kCnn}, {1, 11, 28}, 10),
            "cnn needs images of at least 12x12 (two 5x5 convolutions, each followed by 2x2 max pooling), got "
            "[1, 11, 28]");
  EXPECT_EQ(build_error(ModelSpec{ModelKind::kCnn}, {1, 28, 8}, 10),
            "cnn needs images of at least 12x12 (two 5x5 convolutions, each followed by 2x2 max pooling), got "
            "[1, 28, 8]");
  EXPECT_EQ(build_error(ModelSpec{ModelKind::kCnn}, {784}, 10),
            "cnn expects samples of shape [channels, height, width], got [784]");
  EXPECT_EQ(build_error(ModelSpec{ModelKind::kResnet18}, {784}, 10),
            "resnet18 expects samples of shape [channels, height, width], got [784]");
  for (const auto& [kind, sample] : {std::pair{ModelKind::kCnn, Shape{1, 11, 28}}, std::pair{ModelKind::kCnn, Shape{784}},
                                     std::pair{ModelKind::kResnet18, Shape{784}}})
    EXPECT_EQ(build_error_kind(ModelSpec{kind}, sample, 10), ErrorKind::kUsage) << shape_str(sample);
}

TEST(Models, PlanCountsWhatIsBuilt) {
  for (const ModelSpec& spec : {ModelSpec{ModelKind::kMlp}, ModelSpec{ModelKind::kMlp, {64, 32}}, ModelSpec{ModelKind::kMlp, {}}, ModelSpec{ModelKind::kCnn}}) {
    auto model = build_model(spec, {1, 28, 28}, 10, Device::cpu(), 1);
    EXPECT_EQ(parameter_count(*model), planned_count(spec, {1, 28, 28}, 10)) << model_kind_name(spec.kind);
  }
  EXPECT_EQ(planned_count(ModelSpec{}, {1, 28, 28}, 10), 784 * 256 + 256 + 256 * 10 + 10);
  EXPECT_EQ(build_error(ModelSpec{}, {1, 28, 28}, 0), "mlp needs at least one class, got 0");
}

// The format-valid train file of shape [1, 1, 4000000] made the MLP allocate ~8 GB
// before saying anything; 2 ranks of it do not fit this 25 GB machine.
TEST(Models, RefusesAModelThatCannotFitBeforeAllocating) {
  ModelSpec spec;
  spec.memory_budget_bytes = int64_t{8} << 30;
  EXPECT_EQ(build_error(spec, {1, 1, 4000000}, 10),
            "mlp needs 12.3 GB to train (1024002826 parameters with their gradients and optimizer state), more than "
            "its memory budget of 8.6 GB; its largest layer is Linear(4000000, 256) with 1024000256 parameters "
            "(12.3 GB); no cut into pipeline stages fits (its largest layer alone does not)");
  // Without a budget, the machine's memory: 2^40 parameters fit nowhere.
  EXPECT_THAT(build_error(ModelSpec{ModelKind::kMlp, {1 << 20, 1 << 20}}, {1, 28, 28}, 10),
              HasSubstr("more than this machine's " + format_bytes(double(host_memory_bytes())) +
                        " of memory; its largest layer is Linear(1048576, 1048576)"));
  EXPECT_EQ(build_error(ModelSpec{ModelKind::kMlp, {4611686018427387904}}, {1, 28, 28}, 10),
            "Linear(784, 4611686018427387904): 784 x 4611686018427387904 overflows 64 bits");
  spec.memory_budget_bytes = int64_t{13} << 30;  // 14 GB: fits
  EXPECT_EQ(plan_model(spec, {1, 1, 4000000}, 10).front().parameters, 1024000256);
  EXPECT_EQ(build_error(ModelSpec{}, {1, 28, 28}, 10), "");
}

// Item 5 of issue 22: the refusal says what sharding the optimizer state (ZeRO) would need per
// rank, and counts it when the run shards.
TEST(Models, TheMemoryRefusalSaysWhatZeroWouldChange) {
  ModelSpec spec;
  spec.memory_budget_bytes = int64_t{8} << 30;
  spec.ranks = 4;
  EXPECT_THAT(build_error(spec, {1, 1, 4000000}, 10),
              HasSubstr("(12.3 GB); with its optimizer state sharded over the 4 ranks (ZeRO-1 or 2) it would need 9.2 "
                        "GB per rank"));
  spec.memory_budget_bytes = int64_t{9} << 30;  // 9.7 GB
  EXPECT_THAT(build_error(spec, {1, 1, 4000000}, 10), HasSubstr("it would need 9.2 GB per rank, which fits"));
  spec.zero_stage = 1;  // (at 9.7 GB it would fit: building it would allocate 4 GB, so not tried)
  spec.memory_budget_bytes = int64_t{8} << 30;
  EXPECT_THAT(build_error(spec, {1, 1, 4000000}, 10),
              HasSubstr("mlp needs 9.2 GB to train (1024002826 parameters with their gradients and optimizer state), "
                        "more than its memory budget of 8.6 GB; its largest layer is Linear(4000000, 256) with "
                        "1024000256 parameters (9.2 GB) (per rank, its optimizer state already sharded over 4 ranks "
                        "by ZeRO-1"));
}

// Note [Stage construction]: every stage built alone holds exactly the whole model's tensors of
// its layers, bit for bit and by the same names (the init's draws are skipped, not redrawn), and
// nothing else.
TEST(Models, AStageBuiltAloneHasTheWholeModelsInitialWeights) {
  for (ModelKind kind : {ModelKind::kMlp, ModelKind::kCnn})
    for (float dropout : {0.f, 0.25f}) {
      const ModelSpec spec{kind, {24, 16, 8}, dropout};
      const Shape sample = {1, 16, 16};
      auto whole = build_model(spec, sample, 5, Device::cpu(), 42);
      std::map<std::string, std::vector<float>> expected;
      for (Parameter* p : whole->parameters()) expected[p->name] = p->value.to_vector();
      const size_t n = layer_parameter_counts(spec, sample, 5).size();
      ASSERT_EQ(n, whole->size());
      for (size_t begin = 0; begin < n; ++begin)
        for (size_t end = begin + 1; end <= n; ++end) {
          auto stage = build_model(spec, sample, 5, Device::cpu(), 42, LayerRange{begin, end});
          EXPECT_EQ(stage->size(), end - begin);
          size_t held = 0;
          for (Parameter* p : stage->parameters()) {
            const size_t layer = std::stoul(p->name.substr(0, p->name.find('.')));
            EXPECT_TRUE(layer >= begin && layer < end) << p->name;
            ASSERT_TRUE(expected.count(p->name)) << p->name;
            EXPECT_EQ(p->value.to_vector(), expected[p->name]) << model_kind_name(kind) << " " << p->name;
            ++held;
          }
          size_t planned = 0;
          for (const LayerSize& l : plan_model(spec, sample, 5)) planned += l.index >= begin && l.index < end ? 2 : 0;
          EXPECT_EQ(held, planned) << begin << "-" << end;
        }
    }
}

// Note [ResNet pipeline stages]: every range of resnet18's 8 children built alone holds exactly
// the whole model's parameters and buffers of those children, bit for bit and by the same names
// (the draws before it skipped, not drawn), and nothing else; and cut in two, the stages' forward
// and backward, one after the other, give the whole model's output, input gradient and parameter
// gradients bitwise (Note [Chained joins] kept across the cut: the later stage's first block
// masks by its input, the earlier stage's last block does not).
TEST(Models, AResnetStageBuiltAloneHasTheWholeModelsWeightsAndGradients) {
  const ModelSpec spec{.kind = ModelKind::kResnet18, .width = 4};
  const Shape sample = {1, 8, 8};
  auto whole = build_model(spec, sample, 5, Device::cpu(), 42);
  std::map<std::string, std::vector<float>> expected;
  for (Parameter* p : whole->parameters()) expected[p->name] = p->value.to_vector();
  std::map<std::string, std::string> buffer_shapes;
  for (Buffer* b : whole->buffers()) buffer_shapes[b->name] = shape_str(b->value.shape());
  const size_t n = layer_parameter_counts(spec, sample, 5).size();
  ASSERT_EQ(n, whole->size());
  const std::vector<LayerSize> plan = plan_model(spec, sample, 5);
  for (size_t begin = 0; begin < n; ++begin)
    for (size_t end = begin + 1; end <= n; ++end) {
      auto stage = build_model(spec, sample, 5, Device::cpu(), 42, LayerRange{begin, end});
      EXPECT_EQ(stage->size(), end - begin);
      size_t held = 0, planned = 0, buffers = 0, planned_buffers = 0;
      for (Parameter* p : stage->parameters()) {
        ASSERT_TRUE(expected.count(p->name)) << p->name;
        EXPECT_EQ(p->value.to_vector(), expected[p->name]) << p->name << " in children [" << begin << ", " << end << ")";
        ++held;
      }
      for (Buffer* b : stage->buffers()) {
        ASSERT_TRUE(buffer_shapes.count(b->name)) << b->name;
        EXPECT_EQ(shape_str(b->value.shape()), buffer_shapes[b->name]) << b->name;
        ++buffers;
      }
      for (const LayerSize& l : plan)
        if (l.index >= begin && l.index < end) {
          planned += l.tensors.size();
          planned_buffers += l.buffers.size();
        }
      EXPECT_EQ(held, planned) << begin << "-" << end;
      EXPECT_EQ(buffers, planned_buffers) << begin << "-" << end;
    }
  const Tensor x = Tensor::from_vector(random_values(3 * 64, 5), {3, 1, 8, 8});
  const std::vector<float> g = random_values(3 * 5, 6);
  auto run = [&](std::vector<Sequential*> stages) {
    Tensor y = x;
    for (Sequential* s : stages) y = s->forward(y);
    std::vector<std::vector<float>> out = {y.to_vector()};
    Tensor grad = Tensor::from_vector(g, y.shape());
    for (size_t i = stages.size(); i-- > 0;) grad = stages[i]->backward(grad);
    out.push_back(grad.to_vector());
    std::map<std::string, std::vector<float>> grads;
    for (Sequential* s : stages)
      for (Parameter* p : s->parameters()) grads[p->name] = p->grad.to_vector();
    for (auto& [name, v] : grads) out.push_back(v);
    return out;
  };
  const auto reference = run({whole.get()});
  for (size_t cut = 1; cut < n; ++cut) {
    auto first = build_model(spec, sample, 5, Device::cpu(), 42, LayerRange{0, cut});
    auto second = build_model(spec, sample, 5, Device::cpu(), 42, LayerRange{cut, n});
    EXPECT_TRUE(run({first.get(), second.get()}) == reference) << "cut before child " << cut;
  }
}

// Issue 23 item 5: the refusal of a model too large for one rank says how many pipeline stages
// would fit, and a stage's memory check counts only its layers.
TEST(Models, TheMemoryRefusalNamesPipelineStagesAndAStageCountsItsOwn) {
  ModelSpec spec{ModelKind::kMlp, {1024, 1024, 1024, 1024}};
  const std::vector<LayerSize> plan = plan_model(spec, {1, 28, 28}, 10);
  int64_t total = 0;
  for (const LayerSize& l : plan) total += l.parameters;
  spec.memory_budget_bytes = total * kTrainingBytesPerParameter * 6 / 10;  // 60% of the whole
  EXPECT_THAT(build_error(spec, {1, 28, 28}, 10),
              HasSubstr("; cut into 2 pipeline stages (--pipeline-stages 2, a rank per stage) each stage would fit"));
  spec.pipeline_stages = 2;
  const std::vector<int64_t> counts = layer_parameter_counts(spec, {1, 28, 28}, 10);
  EXPECT_EQ(counts.size(), 10u);  // Flatten, 4 x (Linear, ReLU), Linear
  EXPECT_NO_THROW(build_model(spec, {1, 28, 28}, 10, Device::cpu(), 0, LayerRange{0, 5}));
  EXPECT_NO_THROW(build_model(spec, {1, 28, 28}, 10, Device::cpu(), 0, LayerRange{5, 10}));
  try {
    build_model(spec, {1, 28, 28}, 10, Device::cpu(), 0, LayerRange{0, 8});
    ADD_FAILURE() << "three of four hidden layers fit 60%";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("mlp stage (layers 0-7) needs"));
    EXPECT_EQ(e.kind(), ErrorKind::kResources);
  }
}

}  // namespace
}  // namespace dtrain
