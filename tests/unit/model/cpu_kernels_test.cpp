// The CPU loops of model/cpu_kernels.h against the functors they stand in for (model/kernels.h,
// run through launch() on the CPU).
#include "model/cpu_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "gradcheck.h"
#include "model/attention_kernels.h"
#include "model/gpt_kernels.h"
#include "model/kernels.h"
#include "model/loss.h"

namespace dtrain {
namespace {

using testing::random_values;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(CpuKernels, BroadcastRowsEqualsTheFunctor) {
  for (int64_t rows : {1, 3, 64})
    for (int64_t cols : {1, 7, 256}) {
      const std::vector<float> b = random_values(static_cast<size_t>(cols), 1);
      std::vector<float> want(static_cast<size_t>(rows * cols), NAN), got = want;
      launch(Device::cpu(), rows * cols, kernels::BroadcastRows{want.data(), b.data(), cols});
      cpu::broadcast_rows(b.data(), rows, cols, got.data());
      EXPECT_EQ(got, want) << rows << " x " << cols;
    }
}

// dz bitwise kernels::ReluBackward; db within float rounding of the double sum; db_beta 0
// overwrites even a NaN, 1 accumulates.
TEST(CpuKernels, ReluBackwardWithBiasGradient) {
  for (int64_t rows : {1, 5, 64})
    for (int64_t cols : {3, 10, 256})
      for (float beta : {0.f, 1.f}) {
        const size_t n = static_cast<size_t>(rows * cols);
        const std::vector<float> dy = random_values(n, 2), y = random_values(n, 3);
        std::vector<float> want(n, NAN), got(n, NAN);
        launch(Device::cpu(), rows * cols, kernels::ReluBackward{want.data(), dy.data(), y.data()});
        std::vector<float> db(static_cast<size_t>(cols), beta == 0.f ? NAN : 0.25f);
        cpu::relu_backward_bias(dy.data(), y.data(), rows, cols, got.data(), db.data(), beta);
        EXPECT_EQ(got, want);
        for (int64_t c = 0; c < cols; ++c) {
          double sum = beta == 0.f ? 0.0 : 0.25;
          for (int64_t r = 0; r < rows; ++r) sum += want[static_cast<size_t>(r * cols + c)];
          EXPECT_NEAR(db[static_cast<size_t>(c)], sum, 1e-6 * (1.0 + static_cast<double>(rows))) << "column " << c;
        }
      }
}

TEST(CpuKernels, BiasGradientWithoutReluSumsTheGradientItself) {
  const int64_t rows = 7, cols = 5;
  const std::vector<float> dy = random_values(static_cast<size_t>(rows * cols), 4);
  std::vector<float> db(static_cast<size_t>(cols), NAN);
  cpu::relu_backward_bias(dy.data(), nullptr, rows, cols, nullptr, db.data(), 0.f);
  for (int64_t c = 0; c < cols; ++c) {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) sum += dy[static_cast<size_t>(r * cols + c)];
    EXPECT_NEAR(db[static_cast<size_t>(c)], sum, 1e-6);
  }
}

// The fused pass against CrossEntropyRows, CrossEntropyTotal and ScaleByDeviceScalar in turn:
// bitwise, with and without class weights, mean and sum, and with a label out of range (NaN
// loss, zero gradient) as the reference gives.
TEST(CpuKernels, CrossEntropyInOnePassEqualsTheThreeFunctorsBitwise) {
  const int64_t rows = 9, classes = 10;
  const std::vector<float> logits = random_values(static_cast<size_t>(rows * classes), 5, -4.f, 4.f);
  const std::vector<float> weights = random_values(static_cast<size_t>(classes), 6, 0.1f, 2.f);
  for (bool weighted : {false, true})
    for (bool mean : {true, false})
      for (bool bad_label : {false, true}) {
        std::vector<int32_t> labels(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) labels[static_cast<size_t>(r)] = static_cast<int32_t>((r * 7) % classes);
        if (bad_label) labels[4] = 12;
        const float* w = weighted ? weights.data() : nullptr;
        std::vector<float> grad(static_cast<size_t>(rows * classes), NAN), row_loss(rows), row_weight(rows), totals(2);
        launch_rows(Device::cpu(), rows,
                    kernels::CrossEntropyRows{grad.data(), row_loss.data(), row_weight.data(), logits.data(),
                                              labels.data(), w, classes});
        launch(Device::cpu(), 1, kernels::CrossEntropyTotal{totals.data(), row_loss.data(), row_weight.data(), rows, mean});
        launch(Device::cpu(), rows * classes, kernels::ScaleByDeviceScalar{grad.data(), totals.data() + 1});

        std::vector<float> got_grad(grad.size(), NAN), got_totals(2, NAN);
        cpu::cross_entropy(logits.data(), labels.data(), w, rows, classes, mean, got_grad.data(), got_totals.data());
        const std::string what = fmt::format("weighted {} mean {} bad label {}", weighted, mean, bad_label);
        EXPECT_TRUE(same_bits(got_totals[0], totals[0])) << what << ": loss " << got_totals[0] << " vs " << totals[0];
        EXPECT_TRUE(same_bits(got_totals[1], totals[1])) << what << ": scale";
        for (size_t i = 0; i < grad.size(); ++i) EXPECT_TRUE(same_bits(got_grad[i], grad[i])) << what << " grad " << i;

        // The device's order (model/loss.cpp): the scale from the labels first, then the rows
        // scaled as they are written, then the total: the same bits again.
        std::vector<float> fused_grad(grad.size(), NAN), fused_totals(2, NAN);
        launch(Device::cpu(), 1,
               kernels::CrossEntropyScale{fused_totals.data(), labels.data(), w, rows, classes, mean});
        launch_rows(Device::cpu(), rows,
                    kernels::CrossEntropyRows{fused_grad.data(), row_loss.data(), row_weight.data(), logits.data(),
                                              labels.data(), w, classes, fused_totals.data() + 1});
        launch(Device::cpu(), 1,
               kernels::CrossEntropyTotal{fused_totals.data(), row_loss.data(), row_weight.data(), rows, mean});
        EXPECT_TRUE(same_bits(fused_totals[0], totals[0])) << what << ": scaled rows, loss";
        EXPECT_TRUE(same_bits(fused_totals[1], totals[1])) << what << ": scaled rows, scale";
        for (size_t i = 0; i < grad.size(); ++i)
          EXPECT_TRUE(same_bits(fused_grad[i], grad[i])) << what << ": scaled rows, grad " << i;
      }
}

// The loss keeps its buffers across calls: a smaller batch after a larger one gives what a fresh
// loss gives (value and gradient).
TEST(CpuKernels, CrossEntropyLossSmallerBatchAfterLargerMatchesFresh) {
  auto run = [](CrossEntropyLoss& loss, int64_t rows, uint32_t seed) {
    Tensor logits = Tensor::from_vector(random_values(static_cast<size_t>(rows * 10), seed), {rows, 10});
    Tensor labels = Tensor::empty({rows}, Device::cpu(), DType::kI32);
    for (int64_t r = 0; r < rows; ++r) labels.data_as<int32_t>()[r] = static_cast<int32_t>((r * 3) % 10);
    const float value = loss_value(loss.forward(logits, labels));
    std::vector<float> out = loss.backward().to_vector();
    out.push_back(value);
    return out;
  };
  CrossEntropyLoss used, fresh;
  run(used, 9, 1);
  EXPECT_EQ(run(used, 4, 2), run(fresh, 4, 2));
}

// The embedding's forward row by row gives the functor's bits, a bad token's row NaN included.
TEST(CpuKernels, EmbeddingForwardEqualsTheFunctorBitwise) {
  const int64_t vocab = 7, context = 6, cols = 19, batch = 3, seq = 5, positions = batch * seq;
  const std::vector<float> wte = random_values(static_cast<size_t>(vocab * cols), 14);
  const std::vector<float> wpe = random_values(static_cast<size_t>(context * cols), 15);
  std::vector<int32_t> tokens(static_cast<size_t>(positions));
  for (size_t p = 0; p < tokens.size(); ++p) tokens[p] = static_cast<int32_t>(p * 3 % vocab);
  tokens[4] = -1;
  tokens[9] = static_cast<int32_t>(vocab);
  std::vector<float> want(static_cast<size_t>(positions * cols)), got(want.size());
  launch(Device::cpu(), positions * cols,
         kernels::EmbeddingForward{want.data(), tokens.data(), wte.data(), wpe.data(), seq, cols, vocab});
  cpu::embedding_forward(tokens.data(), wte.data(), wpe.data(), positions, seq, cols, vocab, got.data());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_TRUE(same_bits(got[i], want[i])) << i;
  EXPECT_TRUE(std::isnan(got[static_cast<size_t>(4 * cols)]));
}

// LayerNorm's backward in one pass: the chunks' parameter sums are the functor's bits, dx (its row
// sums interleaved) within float rounding of the functor's, with and without the residual, with
// and without dx, across chunk edges.
TEST(CpuKernels, LayerNormBackwardInOnePassMatchesTheFunctors) {
  for (int64_t rows : {1, 255, 256, 600})
    for (int64_t cols : {1, 7, 256})
      for (bool with_residual : {false, true})
        for (bool with_dx : {false, true}) {
          const size_t n = static_cast<size_t>(rows * cols);
          const std::vector<float> dy = random_values(n, 5), x = random_values(n, 6), res = random_values(n, 7);
          const std::vector<float> w = random_values(static_cast<size_t>(cols), 8);
          std::vector<float> mean = random_values(static_cast<size_t>(rows), 9), rstd(static_cast<size_t>(rows));
          for (size_t r = 0; r < rstd.size(); ++r) rstd[r] = 0.5f + 0.01f * static_cast<float>(r % 50);
          const int64_t chunks = (rows + kernels::kLayerNormChunk - 1) / kernels::kLayerNormChunk;
          const float* residual = with_residual ? res.data() : nullptr;
          std::vector<float> want_partial(static_cast<size_t>(2 * chunks * cols), NAN), got_partial = want_partial;
          std::vector<float> want_dx(n, NAN), got_dx(n, NAN);
          launch(Device::cpu(), chunks * cols,
                 kernels::LayerNormParamPartial{want_partial.data(), dy.data(), x.data(), mean.data(), rstd.data(),
                                                rows, cols, chunks});
          launch_rows(Device::cpu(), rows,
                      kernels::LayerNormBackward{want_dx.data(), dy.data(), x.data(), mean.data(), rstd.data(),
                                                 w.data(), residual, cols});
          cpu::layernorm_backward(dy.data(), x.data(), mean.data(), rstd.data(), w.data(), residual, rows, cols,
                                  got_partial.data(), with_dx ? got_dx.data() : nullptr);
          const std::string what = std::to_string(rows) + " x " + std::to_string(cols);
          for (size_t i = 0; i < want_partial.size(); ++i)
            ASSERT_TRUE(same_bits(got_partial[i], want_partial[i])) << what << ": partial " << i;
          for (size_t i = 0; i < n; ++i) {
            if (with_dx)
              ASSERT_NEAR(got_dx[i], want_dx[i], 1e-5f * (1.f + std::abs(want_dx[i]))) << what << ": dx " << i;
            else
              ASSERT_TRUE(std::isnan(got_dx[i])) << what << ": dx " << i << " written";
          }
        }
}

// LayerNorm's forward with interleaved sums: within float rounding of the functor (output, mean
// and 1/std), the same bits on a second run; rows of a constant give xhat 0 (the bias) as it does.
TEST(CpuKernels, LayerNormForwardIsWithinRoundingOfTheFunctor) {
  for (int64_t rows : {1, 33})
    for (int64_t cols : {1, 7, 8, 256, 770}) {
      const size_t n = static_cast<size_t>(rows * cols);
      std::vector<float> x = random_values(n, 16);
      for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(c)] = 3.f;  // row 0 constant
      const std::vector<float> w = random_values(static_cast<size_t>(cols), 17), b = random_values(static_cast<size_t>(cols), 18);
      std::vector<float> want_y(n), want_mean(static_cast<size_t>(rows)), want_rstd(want_mean.size());
      std::vector<float> got_y(n), got_mean(want_mean.size()), got_rstd(want_mean.size());
      launch_rows(Device::cpu(), rows,
                  kernels::LayerNormForward{want_y.data(), want_mean.data(), want_rstd.data(), x.data(), w.data(),
                                            b.data(), cols, 1e-5f});
      cpu::layernorm_forward(x.data(), w.data(), b.data(), rows, cols, 1e-5f, got_y.data(), got_mean.data(),
                             got_rstd.data());
      std::vector<float> again(n), again_mean(want_mean.size()), again_rstd(want_mean.size());
      cpu::layernorm_forward(x.data(), w.data(), b.data(), rows, cols, 1e-5f, again.data(), again_mean.data(),
                             again_rstd.data());
      EXPECT_EQ(again, got_y);
      const std::string what = std::to_string(rows) + " x " + std::to_string(cols);
      for (size_t i = 0; i < n; ++i) ASSERT_NEAR(got_y[i], want_y[i], 1e-5f * (1.f + std::abs(want_y[i]))) << what << " " << i;
      for (size_t r = 0; r < want_mean.size(); ++r) {
        ASSERT_NEAR(got_mean[r], want_mean[r], 1e-6f) << what;
        ASSERT_NEAR(got_rstd[r], want_rstd[r], 1e-5f * want_rstd[r]) << what;
      }
      for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(got_y[static_cast<size_t>(c)], b[static_cast<size_t>(c)]) << what;
    }
}

// Note [CPU softmax]: within 1e-6 relative of the functor (arith_exp and the 8 partial sums), the
// masked entries inside the causal block 0 as the functor writes them, those right of it never
// written; the same bits on a second run. Rows of several heads, scores spread up to +-400.
TEST(CpuKernels, CausalSoftmaxForwardIsWithinRoundingOfTheFunctor) {
  for (int64_t time : {1, 5, 64, 70, 256})
    for (float spread : {1.f, 30.f, 400.f}) {
      const int64_t rows = 2 * time, block = 64;
      std::vector<float> scores = random_values(static_cast<size_t>(rows * time), 11);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t u = 0; u < time; ++u) {
          float& v = scores[static_cast<size_t>(r * time + u)];
          v = u <= r % time ? v * spread : NAN;  // NaN where the products write nothing
        }
      std::vector<float> want = scores, got = scores, again = scores;
      launch_rows(Device::cpu(), rows, kernels::CausalSoftmaxForward{want.data(), time, block});
      cpu::causal_softmax_forward(got.data(), rows, time, block);
      cpu::causal_softmax_forward(again.data(), rows, time, block);
      for (size_t i = 0; i < want.size(); ++i) {
        const std::string what = std::to_string(time) + " x " + std::to_string(spread) + ", element " +
                                 std::to_string(i);
        ASSERT_TRUE(same_bits(got[i], again[i])) << what;
        if (std::isnan(want[i]) || want[i] == 0.f)
          ASSERT_TRUE(same_bits(got[i], want[i])) << what;
        else
          ASSERT_NEAR(got[i], want[i], 1e-6f * want[i] + 1e-37f) << what;
      }
    }
}

// Softmax backward with its dot product interleaved: within float rounding of the functor, the
// masked entries inside the causal block 0, those right of it never written.
TEST(CpuKernels, CausalSoftmaxBackwardIsWithinRoundingOfTheFunctor) {
  for (int64_t time : {1, 5, 70, 256}) {
    const int64_t rows = 2 * time, block = 64;
    std::vector<float> att = random_values(static_cast<size_t>(rows * time), 19);
    launch_rows(Device::cpu(), rows, kernels::CausalSoftmaxForward{att.data(), time, block});
    std::vector<float> grad = random_values(static_cast<size_t>(rows * time), 20);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t u = kernels::causal_block_end(r % time, block, time); u < time; ++u)
        grad[static_cast<size_t>(r * time + u)] = NAN;  // never written by the products either
    std::vector<float> want = grad, got = grad;
    launch_rows(Device::cpu(), rows, kernels::CausalSoftmaxBackward{want.data(), att.data(), time, block});
    cpu::causal_softmax_backward(got.data(), att.data(), rows, time, block);
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i]) || want[i] == 0.f)
        ASSERT_TRUE(same_bits(got[i], want[i])) << time << " " << i;
      else
        ASSERT_NEAR(got[i], want[i], 1e-6f * (1.f + std::abs(want[i]))) << time << " " << i;
    }
  }
}

}  // namespace
}  // namespace dtrain
