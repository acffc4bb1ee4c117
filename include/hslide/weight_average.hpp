// An exponential moving average of a model's weights and biases (Polyak averaging): the
// model a run evaluates, keeps and saves, while the optimizer goes on from its own weights.
//
// Adam at a constant rate leaves the weights jittering around a minimum; their average over
// the last half epoch or so sits nearer its centre. With a time constant of half an epoch it
// raised test P@1 on Debian-recs, Bibtex and Corel5k over 6 seeds (bench/peers.md,
// 2026-12-07) in place of the drop of the rate --epochs auto ended with before, in about
// as many epochs. The average is updated `ticks_per_epoch` times an epoch, at evenly spaced
// steps (the last at the epoch's end): average = keep * average + (1 - keep) * weights, keep
// set from a time constant in epochs, so the same setting means the same on a set of 4,000
// points or of 4 million. The first tick copies the weights (an average started from the
// random initialisation would carry it for epochs).
#pragma once

#include "hslide/model.hpp"

#include <cstdint>

namespace hslide {

/// Updates of the average an epoch. Each reads the whole model and writes the average once:
/// 1.75 ms for Debian-recs' 4.4 M parameters on a 2-core Ice Lake, 2-3% of an epoch at 4.
constexpr uint32_t weight_average_ticks_per_epoch = 4;
/// The time constant, in epochs, of train_config::ema_epochs' auto (-1).
constexpr double weight_average_auto_epochs = 0.5;

/// What each tick keeps of the average for a time constant of `epochs` epochs (> 0):
/// exp(-1 / (epochs * ticks_per_epoch)).
float weight_average_keep(double epochs, uint32_t ticks_per_epoch = weight_average_ticks_per_epoch);

/// Whether step `step` (0-based) of an epoch of `steps` steps ends with a tick: the steps
/// that end each of the epoch's `ticks` even shares of steps (every step when there are fewer
/// steps than ticks), the last step always.
bool weight_average_tick_after(uint64_t step, uint64_t steps,
                               uint32_t ticks = weight_average_ticks_per_epoch);

/// One tick: `average` becomes keep * average + (1 - keep) * `current`, over every layer's
/// weights and biases (by the OpenMP threads). Where `average` holds no layers yet it becomes a
/// copy of `current`'s parameters. Throws hslide::error when their layer shapes differ.
void blend_into_average(model_state& average, const model_state& current, float keep);

}  // namespace hslide
