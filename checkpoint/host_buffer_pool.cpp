#include "checkpoint/host_buffer_pool.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace dtrain::checkpoint {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

std::byte* allocate(size_t bytes) {
  const size_t align = bytes >= kHugePage ? kHugePage : 64;
  const size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded ? rounded : align);
  if (!p) throw std::bad_alloc();
  if (align == kHugePage) ::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: ignore failure
  return static_cast<std::byte*>(p);
}

}  // namespace

HostBufferPool::State::~State() {
  for (auto& [size, p] : free) std::free(p);
}

HostBufferPool::HostBufferPool() : state_(std::make_shared<State>()) {}

std::shared_ptr<std::byte> HostBufferPool::get(size_t bytes) {
  std::byte* p = nullptr;
  {
    std::lock_guard lock(state_->mutex);
    if (auto it = state_->free.find(bytes); it != state_->free.end()) {
      p = it->second;
      state_->free.erase(it);
    }
  }
  if (!p) p = allocate(bytes);
  return std::shared_ptr<std::byte>(p, [state = state_, bytes](std::byte* q) {
    std::lock_guard lock(state->mutex);
    state->free.emplace(bytes, q);

  });
}

size_t HostBufferPool::free_bytes() const {
  std::lock_guard lock(state_->mutex);
  size_t total = 0;
  for (const auto& [size, p] : state_->free) total += size;
  return total;
}

}  // namespace dtrain::checkpoint
