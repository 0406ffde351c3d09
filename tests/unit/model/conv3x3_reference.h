// The 3x3, padding-1 convolution in double loops that the CPU kernels' tests (direct,
// Winograd) compare against: forward, weight, bias and input gradients, each with the sums of its
// terms' magnitudes (the tolerance's scale).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "model/kernels.h"

namespace dtrain::testing {

struct Case {
  int64_t batch, in_c, out_c, h, w, stride = 1;
  int64_t oh() const { return (h - 1) / stride + 1; }
  int64_t ow() const { return (w - 1) / stride + 1; }
};

inline kernels::ConvGeometry geometry3x3(int64_t c, int64_t h, int64_t w, int64_t stride = 1) {
  return {c, h, w, 3, 3, stride, 1, (h - 1) / stride + 1, (w - 1) / stride + 1};
}

struct Reference {
  std::vector<double> y, y_abs, dw, dw_abs, db, dx, dx_abs;
};

inline Reference reference(const Case& t, const std::vector<float>& x, const std::vector<float>& w,
                           const std::vector<float>& b, const std::vector<float>& dy_masked) {
  Reference r;
  r.y.assign(static_cast<size_t>(t.batch * t.out_c * t.oh() * t.ow()), 0.0);
  r.y_abs = r.y;
  r.dw.assign(w.size(), 0.0);
  r.dw_abs = r.dw;
  r.db.assign(static_cast<size_t>(t.out_c), 0.0);
  r.dx.assign(x.size(), 0.0);
  r.dx_abs = r.dx;
  for (int64_t n = 0; n < t.batch; ++n)
    for (int64_t co = 0; co < t.out_c; ++co)
      for (int64_t oy = 0; oy < t.oh(); ++oy)
        for (int64_t ox = 0; ox < t.ow(); ++ox) {
          const size_t o = static_cast<size_t>(((n * t.out_c + co) * t.oh() + oy) * t.ow() + ox);
          r.y[o] = b[static_cast<size_t>(co)];
          r.db[static_cast<size_t>(co)] += dy_masked[o];
          for (int64_t ci = 0; ci < t.in_c; ++ci)
            for (int64_t ky = 0; ky < 3; ++ky)
              for (int64_t kx = 0; kx < 3; ++kx) {
                const int64_t iy = oy * t.stride - 1 + ky, ix = ox * t.stride - 1 + kx;
                if (iy < 0 || iy >= t.h || ix < 0 || ix >= t.w) continue;
                const size_t wi = static_cast<size_t>(((co * t.in_c + ci) * 3 + ky) * 3 + kx);
                const size_t xi = static_cast<size_t>(((n * t.in_c + ci) * t.h + iy) * t.w + ix);
                r.y[o] += static_cast<double>(w[wi]) * x[xi];
                r.y_abs[o] += std::fabs(static_cast<double>(w[wi]) * x[xi]);
                r.dw[wi] += static_cast<double>(dy_masked[o]) * x[xi];
                r.dw_abs[wi] += std::fabs(static_cast<double>(dy_masked[o]) * x[xi]);
                r.dx[xi] += static_cast<double>(dy_masked[o]) * w[wi];
                r.dx_abs[xi] += std::fabs(static_cast<double>(dy_masked[o]) * w[wi]);
              }
        }
  return r;
}

}  // namespace dtrain::testing
