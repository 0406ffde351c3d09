// dtrain's CausalSelfAttention for tests/torch/attention_test.py: reads the sizes, the four
// parameters, x and dy, runs one forward and backward on the CPU, writes y, dx and the four
// gradients. Files are raw little-endian: IN = int64 B, T, C, H, then float32 c_attn.weight,
// c_attn.bias, c_proj.weight, c_proj.bias, x (B, T, C), dy (B, T, C); OUT = float32 y, dx and
// the gradients in parameter order.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <vector>

#include "model/attention.h"

namespace {

std::vector<float> read_floats(std::ifstream& in, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  return v;
}

void write_tensor(std::ofstream& out, const dtrain::Tensor& t) {
  const std::vector<float> v = t.to_vector();
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: dtrain_attention_tool IN OUT\n");
    return 2;
  }
  using dtrain::Tensor;
  std::ifstream in(argv[1], std::ios::binary);
  int64_t size[4] = {};
  in.read(reinterpret_cast<char*>(size), sizeof(size));
  const int64_t B = size[0], T = size[1], C = size[2], H = size[3];
  dtrain::InitRng rng(0);
  dtrain::CausalSelfAttention layer(C, H, T, dtrain::Device::cpu(), rng, 0.02f);
  for (dtrain::Parameter* p : layer.parameters()) {
    p->value.copy_from(Tensor::from_vector(read_floats(in, p->value.numel()), p->value.shape()));
    p->grad_is_zero = true;
  }
  const Tensor x = Tensor::from_vector(read_floats(in, B * T * C), {B, T, C});
  const Tensor dy = Tensor::from_vector(read_floats(in, B * T * C), {B, T, C});
  if (!in) {
    std::fprintf(stderr, "dtrain_attention_tool: %s is too short\n", argv[1]);
    return 65;
  }
  std::ofstream out(argv[2], std::ios::binary);
  write_tensor(out, layer.forward(x));
  write_tensor(out, layer.backward(dy, true));
  for (dtrain::Parameter* p : layer.parameters()) write_tensor(out, p->grad);
  return out ? 0 : 1;
}
