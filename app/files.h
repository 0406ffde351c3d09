// Output files the app writes: complete or absent, never half-written.
#pragma once

#include <string>

namespace dtrain {

// Writes `text` to `path` through a temporary file beside it, flushed to disk and renamed into
// place. Throws Error naming the path and the OS error.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace dtrain
