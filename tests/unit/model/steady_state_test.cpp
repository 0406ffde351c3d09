// After its first steps, a CPU training step (forward, loss, backward, SGD step) of the built-in
// MLP and CNN takes no memory from the system: no tensor buffer from the system allocator, no heap
// block of 4 KiB or more, and no page fault (a fresh page touched) on the thread that runs it;
// also when evaluation batches of another size come between the steps. (Small heap blocks, the
// shape vectors that Tensor handles copy, come from malloc's own free lists and are not counted.)
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "core/host_allocator.h"
#include "core/ops.h"
#include "gradcheck.h"
#include "model/gpt.h"
#include "model/loss.h"
#include "model/models.h"
#include "model/optimizer.h"

// Counts heap allocations of this test binary (a program may replace the global operator new).
namespace {
std::atomic<int64_t> g_large_heap_allocs{0};
constexpr size_t kLargeHeapBlock = 4096;

void* counted_new(size_t bytes) {
  if (bytes >= kLargeHeapBlock) g_large_heap_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(size_t bytes) { return counted_new(bytes); }
void* operator new[](size_t bytes) { return counted_new(bytes); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace dtrain {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderAddressSanitizer = true;
#else
constexpr bool kUnderAddressSanitizer = false;
#endif

struct Usage {
  int64_t system_allocs, large_heap_allocs, page_faults;
};

Usage usage_now() {
  rusage r{};
  getrusage(RUSAGE_THREAD, &r);
  return {HostAllocator::instance().stats().system_allocs, g_large_heap_allocs.load(), r.ru_minflt};
}

// The GEMM on one thread while a test counts: with several, the CPU pool hands the calling
// thread other partitions from step to step, and their first touch of its stack and scratch
// counted as this thread's page faults (about 1 run in 5 of the GPT's test on 2 cores).
struct OneCpuThread {
  int saved = set_cpu_threads(0);
  OneCpuThread() { set_cpu_threads(1); }
  ~OneCpuThread() { set_cpu_threads(saved); }
};

// One training step as the trainer runs it on one rank.
struct Job {
  std::unique_ptr<Sequential> model;
  std::unique_ptr<Sgd> optimizer;
  CrossEntropyLoss loss;
  Tensor images, labels;

  Job(const std::string& name, int64_t batch) {
    model = build_model(ModelSpec{*parse_model_kind(name), {256}, 0.f}, {1, 28, 28}, 10, Device::cpu(), 1);
    optimizer = std::make_unique<Sgd>(model->parameters(), SgdOptions{0.01f, 0.9f, 0.f, 0.f, false});
    images = Tensor::from_vector(testing::random_values(static_cast<size_t>(batch * 784), 3), {batch, 1, 28, 28});
    std::vector<int32_t> y(static_cast<size_t>(batch));
    for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int32_t>(i % 10);
    labels = Tensor::empty({batch}, Device::cpu(), DType::kI32);
    std::copy(y.begin(), y.end(), labels.data_as<int32_t>());
  }
  void step() {
    optimizer->zero_grad();
    Tensor logits = model->forward(images);
    loss.forward(logits, labels);
    model->backward(loss.backward(), false);
    optimizer->step();
  }
};

TEST(SteadyState, ATrainingStepTakesNoMemoryFromTheSystem) {
  if (kUnderAddressSanitizer) GTEST_SKIP() << "AddressSanitizer allocates for its own bookkeeping";
  const OneCpuThread one_thread;
  for (const char* name : {"mlp", "cnn"}) {
    Job job(name, 64);
    job.step();
    job.step();
    const Usage before = usage_now();
    for (int i = 0; i < 3; ++i) job.step();
    const Usage after = usage_now();
    EXPECT_EQ(after.system_allocs, before.system_allocs) << name << ": tensor buffers from the system allocator";
    EXPECT_EQ(after.large_heap_allocs, before.large_heap_allocs) << name << ": heap blocks of 4 KiB or more";
    EXPECT_EQ(after.page_faults, before.page_faults) << name << ": page faults";
  }
}

// The GPT too: every layer keeps its buffers (ensure_tensor), the embedding's token buckets included.
TEST(SteadyState, AGptTrainingStepTakesNoMemoryFromTheSystem) {
  if (kUnderAddressSanitizer) GTEST_SKIP() << "AddressSanitizer allocates for its own bookkeeping";
  const OneCpuThread one_thread;
  auto model = build_gpt(GptSpec{64, 16, 2, 2, 32}, Device::cpu(), 1);
  Sgd optimizer(model->parameters(), SgdOptions{0.01f, 0.9f, 0.f, 0.f, false});
  CrossEntropyLoss loss;
  Tensor tokens = Tensor::empty({4, 16}, Device::cpu(), DType::kI32), targets = Tensor::empty({64}, Device::cpu(), DType::kI32);
  for (int32_t i = 0; i < 64; ++i) {
    tokens.data_as<int32_t>()[i] = (i * 7) % 64;
    targets.data_as<int32_t>()[i] = (i * 7 + 1) % 64;
  }
  auto step = [&] {
    optimizer.zero_grad();
    loss.forward(model->forward(tokens), targets);
    model->backward(loss.backward());
    optimizer.step();
  };
  step();
  step();
  const Usage before = usage_now();
  for (int i = 0; i < 3; ++i) step();
  const Usage after = usage_now();
  EXPECT_EQ(after.system_allocs, before.system_allocs) << "tensor buffers from the system allocator";
  EXPECT_EQ(after.large_heap_allocs, before.large_heap_allocs) << "heap blocks of 4 KiB or more";
  EXPECT_EQ(after.page_faults, before.page_faults) << "page faults";
}

// The trainer evaluates after every epoch with batches of another size (1000), which replaces
// every layer's buffers, and training then replaces them back. After one such round trip both
// directions are served from the allocator's cache.
TEST(SteadyState, TrainingAfterEvaluationTakesNoMemoryFromTheSystem) {
  if (kUnderAddressSanitizer) GTEST_SKIP() << "AddressSanitizer allocates for its own bookkeeping";
  const OneCpuThread one_thread;
  for (const char* name : {"mlp", "cnn"}) {
    Job job(name, 64);
    const Tensor test_images = Tensor::from_vector(testing::random_values(100 * 784, 4), {100, 1, 28, 28});
    Tensor test_labels = Tensor::empty({100}, Device::cpu(), DType::kI32);
    for (int32_t i = 0; i < 100; ++i) test_labels.data_as<int32_t>()[i] = i % 10;
    CrossEntropyLoss eval_loss(Reduction::kSum);
    auto epoch = [&] {
      job.step();
      job.step();
      job.model->set_training(false);
      Tensor logits = job.model->forward(test_images);
      loss_value(eval_loss.forward(logits, test_labels));
      count_correct(logits, test_labels);
      job.model->set_training(true);
    };
    epoch();
    epoch();
    const Usage before = usage_now();
    epoch();
    const Usage after = usage_now();
    EXPECT_EQ(after.system_allocs, before.system_allocs) << name << ": tensor buffers from the system allocator";
    EXPECT_EQ(after.large_heap_allocs, before.large_heap_allocs) << name << ": heap blocks of 4 KiB or more";
    EXPECT_EQ(after.page_faults, before.page_faults) << name << ": page faults";
  }
}

}  // namespace
}  // namespace dtrain
