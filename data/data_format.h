// The data formats `dtrain train --data DIR` reads, and telling them apart from what DIR holds.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dtrain {

// kAuto: decided by detect_data_format. kIdx: the MNIST family's IDX files (data/mnist.h).
// kLlmc: llm.c token shards (data/token_shards.h). kNpy: NumPy arrays (data/npy_dataset.h).
enum class DataFormat { kAuto, kIdx, kLlmc, kNpy };

const char* data_format_name(DataFormat format);  // "auto", "idx", "llmc", "npy"
std::optional<DataFormat> parse_data_format(std::string_view name);

// kLlmc when some DIR/*train*.bin starts with an llm.c magic (20240520 or 20240801); else kIdx
// when DIR holds the IDX training images (train-images-idx3-ubyte or .gz); else kNpy when DIR holds
// NumPy training data (train.npz or train_x.npy); else throws Error
// (kData), one line saying what DIR lacks (or that it is no directory).
DataFormat detect_data_format(const std::string& dir);

}  // namespace dtrain
