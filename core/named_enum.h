// EnumNames: an enum's values and their names in one table, so that a setting's name and its
// parsing cannot disagree (model kinds, optimizers, LR schedules, comm hooks all use it).
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>

namespace dtrain {

template <class E, size_t N>
struct EnumNames {
  std::array<std::pair<E, const char*>, N> entries;

  const char* name(E value) const {
    for (const auto& [v, n] : entries)
      if (v == value) return n;
    return "?";
  }
  std::optional<E> parse(std::string_view text) const {
    for (const auto& [v, n] : entries)
      if (text == n) return v;
    return std::nullopt;
  }
};

template <class E, class... Entries>
constexpr auto enum_names(Entries... entries) {
  return EnumNames<E, sizeof...(Entries)>{{entries...}};
}

}  // namespace dtrain
