// Synthetic extreme multi-label data shaped like the public XC benchmarks (Amazon-670K,
// Delicious-200K, WikiLSHTC-325K), with planted structure a model can learn.
//
// The generative model (every random choice derives from `synthetic_config::seed`):
//
//  Labels. Label frequency follows a shifted power law: the label of frequency rank r
//  (0-based) has prior p_r ∝ (r + 1 + b)^-a (exponent a = `label_exponent`, offset
//  b = `label_offset`). The offset flattens the head so that no single label dominates
//  (the most-frequent-label guess stays weak) while the top few percent of labels still
//  carry most label occurrences (so a model sees them often enough to learn them). Ranks map
//  to label ids through a random permutation, so id order says nothing about frequency.
//
//  Topics. Labels are grouped into topics of `topic_size` labels on average (each label's
//  topic is uniform at random, independent of its frequency). A point's first label is drawn
//  from the global prior; every further label, with probability `label_coherence`, comes from
//  the first label's topic (in proportion to the prior within the topic), otherwise from the
//  global prior. Labels are drawn without replacement. This is the label co-occurrence real
//  data shows, and it keeps the marginal label frequencies equal to the prior.
//
//  Prototypes. Label r has a sparse prototype of `prototype_size` slots; slot j has weight
//  ∝ (j + 1)^-`prototype_decay` and holds one feature id: with probability `topic_share` a
//  feature from the label's topic pool (`topic_pool_size` features per topic, so sibling
//  labels share part of their prototypes), otherwise a feature uniform over all D ids.
//  Prototypes overlap across labels (D < L on Amazon), so a single feature identifies no
//  label: combinations do. Prototypes are hashes of (seed, rank, slot): nothing is stored.
//
//  Features. A point draws its number of distinct features from a log-normal around the
//  preset's mean (spread `features_sigma`), then draws tokens until it has that many distinct
//  features: with probability `signal` a token comes from one of its labels' prototypes
//  (label uniform among the point's labels, slot by slot weight), otherwise it is noise from a
//  global power law over features (rank s has probability ∝ (s + 1 + `feature_offset`)^
//  -`feature_exponent`, ranks mapped to ids by a random permutation). Feature values are
//  tf-idf-like: (1 + ln tf) · idf(f) · u with idf(f) = ln(1 + 1 / (F · q_f)) (q_f the noise
//  probability of f, F the mean features per point) and u uniform in [0.75, 1.25); each point
//  is then L2-normalised and values are rounded to 5 decimals (never to 0), so a written file
//  reads back bit-identical. Feature ids are sorted and unique; label ids sorted and unique.
//
//  Labels per point: 1 + Poisson(mean - 1), at most L.
//
// Determinism: points are generated in chunks of `synthetic_chunk_points`; chunk c of the
// train (test) split draws from its own stream derive_seed(derive_seed(seed, split), c), so
// the data depends only on the config, never on the number of OpenMP threads.
//
// Learnability (see bench/synthetic.md for the figures): with the defaults at amazon670k's
// full label count and scale 0.1, the most-frequent-label guess scores P@1 below 0.02 and a
// label-centroid classifier (`measure_learnability`) scores well above 0.3.
#pragma once

#include "hslide/dataset.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hslide {

/// The knobs of the generative model (see the file comment for what each one does).
struct synthetic_model {
    double label_exponent = 1.0;    ///< a: label prior ∝ (rank + 1 + b)^-a
    double label_offset = 100.0;    ///< b: flattens the head of the label prior
    double feature_exponent = 1.0;  ///< noise-feature prior exponent
    double feature_offset = 10.0;   ///< noise-feature prior offset
    uint32_t prototype_size = 32;   ///< feature slots per label prototype
    double prototype_decay = 0.5;   ///< slot j weight ∝ (j + 1)^-decay
    double topic_share = 0.3;       ///< fraction of prototype slots drawn from the topic pool
    uint32_t topic_size = 50;       ///< mean labels per topic
    uint32_t topic_pool_size = 64;  ///< features in each topic's pool
    double label_coherence = 0.5;   ///< P(a further label comes from the first label's topic)
    double signal = 0.6;            ///< P(a feature token comes from the labels' prototypes)
    double features_sigma = 0.5;    ///< log-normal spread of the features-per-point count
};

/// A named shape: sizes and per-point statistics of a public dataset, and its model knobs.
struct synthetic_preset {
    std::string name;
    uint64_t n_features = 0;        ///< D
    uint64_t n_labels = 0;          ///< L
    uint64_t n_train = 0;           ///< train points at scale 1
    uint64_t n_test = 0;            ///< test points at scale 1
    double features_per_point = 0;  ///< mean distinct features per point
    double labels_per_point = 0;    ///< mean labels per point (>= 1)
    synthetic_model model;
};

/// The built-in presets: amazon670k, delicious200k, wikilshtc325k, tiny (for tests).
const std::vector<synthetic_preset>& synthetic_presets();

/// The preset called `name`; throws hslide::error(invalid_argument) listing the valid names.
const synthetic_preset& find_synthetic_preset(const std::string& name);

/// What to generate.
struct synthetic_config {
    std::string preset = "amazon670k";
    double scale = 1.0;       ///< multiplies the preset's train and test point counts (> 0)
    uint64_t n_labels = 0;    ///< 0 = the preset's L
    uint64_t n_features = 0;  ///< 0 = the preset's D
    uint64_t n_train = 0;     ///< 0 = preset n_train x scale (at least 1)
    uint64_t n_test = 0;      ///< 0 = preset n_test x scale (at least 1)
    uint64_t seed = 1;
    std::optional<synthetic_model> model;  ///< replaces the preset's knobs when set
};

/// The preset with the config's overrides and scale applied (what generate_synthetic uses).
/// Throws hslide::error(invalid_argument) for an unknown preset or an out-of-range value.
synthetic_preset resolve_synthetic(const synthetic_config& config);

/// Points per generation chunk (each chunk has its own random stream).
constexpr uint64_t synthetic_chunk_points = 1024;

/// A generated train/test pair (same D, L and generative model; independent points).
struct synthetic_data {
    dataset train;
    dataset test;
};

/// Generates the train and test splits (OpenMP-parallel, deterministic in the config).
/// Both datasets have source "synthetic:<preset>". `show_progress`: a progress bar (or log
/// lines) over the points generated.
synthetic_data generate_synthetic(const synthetic_config& config, bool show_progress = false);

/// Generates and writes `dir`/train.txt and `dir`/test.txt in XC format (creating `dir`).
/// Throws hslide::error(io) naming the path when a directory or file cannot be written.
void generate_synthetic_files(const synthetic_config& config, const std::string& dir,
                              bool show_progress = false);

/// Statistics of a train/test pair and P@1 of simple baselines, used to check that data is
/// learnable but not trivially (tests, bench/bench_synthetic.cpp).
struct learnability_report {
    double train_features_per_point = 0;
    double train_labels_per_point = 0;
    double labels_seen_fraction = 0;      ///< labels of L with at least one train occurrence
    double top_label_point_fraction = 0;  ///< train points carrying the most frequent label
    double top1pct_coverage = 0;          ///< share of train label occurrences on the top 1% of L
    double top5pct_coverage = 0;          ///< ... on the top 5% of L
    uint64_t test_points = 0;             ///< test points evaluated
    double p1_most_frequent = 0;   ///< P@1 of always predicting the most frequent train label
    double p1_centroid = 0;        ///< P@1 of the label-centroid classifier
    double p1_centroid_top5 = 0;   ///< ... restricted to the 5 most frequent train labels
    double p1_centroid_tenth = 0;  ///< ... seeing only features with id % 10 == 0
};

/// Computes the report. The label-centroid classifier scores test point x against every
/// label l seen in training by x · c_l, where c_l is the sum of the (normalised) feature
/// vectors of l's training points, and predicts the best label. At most `max_test_points`
/// test points are evaluated (the first ones; 0 = all).
learnability_report measure_learnability(const dataset& train, const dataset& test,
                                         uint64_t max_test_points = 0);

}  // namespace hslide
