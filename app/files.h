// Output files the app writes: complete or absent, never half-written; and the checks, at start,
// that they can be written at all.
#pragma once

#include <string>

namespace dtrain {

// Writes `text` to `path` through a temporary file beside it, flushed to disk and renamed into
// place. Throws Error naming the path and the OS error.
void write_file_atomically(const std::string& path, const std::string& text);

// Throws Error "<flag>: <dir>: cannot write there: <reason>" unless a file can be created in the
// directory `dir` (probed with a file created and removed at once). `create`: make it first (and
// its parents) when missing.
void check_writable_dir(const std::string& flag, const std::string& dir, bool create);

// Throws Error "<flag>: <path>: cannot write there: <reason>" unless `path` can be written: an
// existing file opened for writing (not truncated), else a file created beside it.
void check_writable_file(const std::string& flag, const std::string& path);

}  // namespace dtrain
