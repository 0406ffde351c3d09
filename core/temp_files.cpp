#include "core/temp_files.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <filesystem>

#include <fmt/format.h>

namespace dtrain {

namespace {
constexpr std::string_view kInfix = ".tmp";
}  // namespace

std::string temporary_path(const std::string& path) { return fmt::format("{}{}{}", path, kInfix, ::getpid()); }

std::optional<pid_t> temporary_owner(std::string_view name, std::string_view target) {
  if (!name.starts_with(target)) return std::nullopt;
  name.remove_prefix(target.size());
  if (!name.starts_with(kInfix)) return std::nullopt;
  name.remove_prefix(kInfix.size());
  if (name.empty() || name[0] == '0' || name[0] == '+' || name[0] == '-') return std::nullopt;
  pid_t pid = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), pid);
  if (ec != std::errc() || end != name.data() + name.size() || pid <= 0) return std::nullopt;
  return pid;
}

bool process_alive(pid_t pid) {
  if (pid == ::getpid()) return true;
  return ::kill(pid, 0) == 0 || errno != ESRCH;  // EPERM: alive, another user's
}

int remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string name = target.filename().string();
  if (name.empty()) return 0;
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto owner = temporary_owner(it->path().filename().string(), name);
    std::error_code ignored;
    if (owner && !process_alive(*owner) && it->is_regular_file(ignored) && fs::remove(it->path(), ignored)) ++removed;
  }
  return removed;
}

}  // namespace dtrain
