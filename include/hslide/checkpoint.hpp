// Model checkpoints: weights, optimizer state, hash seeds, the trainer's state (epoch, step,
// rebuild schedule, RNG state), the training label counts (for PSP@k at evaluation) and the
// labels the output rows stand for (label_map.hpp), in one checkpoint_file. Written to a temporary
// file and renamed, so a crash never destroys the previous checkpoint; a corrupt, truncated or
// mismatched file is a clear error.
#pragma once

#include "hslide/candidate_cache.hpp"
#include "hslide/label_map.hpp"
#include "hslide/model.hpp"
#include "hslide/trainer.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hslide {

/// What a checkpoint holds.
struct checkpoint_contents {
    /// Parameters and Adam state. Where the run averaged its weights (weight_average.hpp) the
    /// weights and biases are the average: the model to score with.
    model_state model;
    /// Where the weights are an average: the weights and biases the optimizer was at
    /// (parameters only), from which a resumed run trains on. Unset otherwise.
    std::optional<model_state> training_weights;
    trainer_state trainer;               ///< where training stopped
    std::vector<uint32_t> label_counts;  ///< training points per label (may be empty)
    uint64_t train_points = 0;           ///< training points the counts come from
    label_map rows;  ///< the label each output row stands for (identity in older files)
    /// The output layer's reused candidates (candidate_cache.hpp); empty where the run kept
    /// none.
    candidate_cache candidates;
};

/// Writes a checkpoint atomically (temporary file, then rename). `training_weights`: where
/// `model`'s weights are an average, the weights the optimizer is at (checkpoint_contents);
/// `candidates`: the output layer's reused candidates, where the run keeps them.
void save_checkpoint(const std::string& path, const model_state& model,
                     const trainer_state& trainer, const std::vector<uint32_t>& label_counts = {},
                     uint64_t train_points = 0, const label_map& rows = {},
                     const model_state* training_weights = nullptr,
                     const candidate_cache* candidates = nullptr);

/// Reads and fully validates a checkpoint; throws hslide::input_error naming the file and the
/// problem (not a checkpoint, truncated, checksum mismatch, layer shapes that disagree...).
checkpoint_contents load_checkpoint(const std::string& path);

/// Throws hslide::error (invalid_argument) when a run of `train.epochs` epochs in total,
/// resumed from the checkpoint at `path` that has done `done.epochs_done`, would train
/// nothing, or when the run and the checkpoint differ in --epochs auto (an auto run trained
/// without its held-out points and kept its best model; a fixed run used every point).
void check_resume_epochs(const train_config& train, const trainer_state& done,
                         const std::string& path);

}  // namespace hslide
