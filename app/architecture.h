// The architecture a weights file records in its safetensors __metadata__ (keys "dtrain.*"), so
// that `dtrain eval` and users rebuild the model without being told: the model kind, hidden
// widths, dropout, input shape, classes and the input normalisation it was trained with.
#pragma once

#include <optional>
#include <string>

#include "checkpoint/safetensors.h"
#include "core/tensor.h"
#include "data/mnist.h"
#include "model/gpt.h"
#include "model/models.h"

namespace dtrain {

struct Architecture {
  ModelSpec model;
  Shape input_shape;  // one sample, e.g. {1, 28, 28}
  int classes = 0;
  Normalize normalize;
};

// {"format": "pt", "dtrain.model": "mlp", "dtrain.hidden": "256", ...}; "format": "pt" is what
// Hugging Face's loaders expect of a PyTorch state_dict.
safetensors::Metadata architecture_metadata(const Architecture& arch);

// The architecture a file records; nullopt when it records none (a file written elsewhere).
// Throws Error "<source>: __metadata__ <key>: <problem>" when it records one badly.
std::optional<Architecture> architecture_from_metadata(const safetensors::Metadata& metadata,
                                                       const std::string& source);

// Checks that `weights` holds every parameter `arch` implies with its shape, before a model is
// built (so a file whose metadata claims a huge model costs nothing): throws Error "<source>:
// tensor '1.weight' has shape [256, 784], but the architecture (mlp 784-2500000-10) needs
// [2500000, 784]", or names the tensor missing.
void check_weights_fit(const safetensors::File& weights, const Architecture& arch);

// --model gpt: {"format": "pt", "dtrain.model": "gpt", "dtrain.layers": "4", "dtrain.heads": "4",
// "dtrain.embd": "256", "dtrain.context": "256", "dtrain.vocab": "256"}, so that `dtrain sample`
// and `dtrain eval` rebuild the model from the file alone.
safetensors::Metadata gpt_architecture_metadata(const GptSpec& spec);
// The GPT a file records; nullopt when it records no "dtrain.model" or another model. Throws
// Error "<source>: __metadata__ dtrain.heads: expected ..., got '...'" when it records one badly.
std::optional<GptSpec> gpt_spec_from_metadata(const safetensors::Metadata& metadata, const std::string& source);

// Checks that `weights` holds as many numbers as the GPT `spec` has parameters, before the model
// is built: a file whose metadata claims a larger model than its tensors hold fails having
// allocated nothing (a wrong name or shape is load_parameters' one line later). Throws Error
// "<source>: the metadata's GPT (L2 H2 C32 T32 V256) has N parameters, the file holds M".
void check_gpt_weights_fit(const safetensors::File& weights, const GptSpec& spec);

// Loads every parameter of `model` from the tensor of its name in `weights`; a tensor missing,
// of another shape, or left over is an Error naming it (safetensors::load_named).
void load_parameters(const safetensors::File& weights, Module& model);

// "mlp 784-256-10" / "cnn", for messages.
std::string describe(const Architecture& arch);

}  // namespace dtrain
