// The synthetic multi-label generator (see include/hslide/synthetic.hpp for the model) and the
// learnability report used to tune it.
#include "hslide/synthetic.hpp"

#include "hslide/error.hpp"
#include "hslide/memory.hpp"
#include "hslide/progress.hpp"
#include "hslide/rng.hpp"

#include <omp.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

namespace hslide {

namespace {

synthetic_model tiny_model() {
    synthetic_model m;
    m.label_offset = 5.0;
    m.prototype_size = 16;
    m.topic_size = 10;
    m.topic_pool_size = 24;
    return m;
}

std::vector<synthetic_preset> make_presets() {
    std::vector<synthetic_preset> p;
    p.push_back({"amazon670k", 135909, 670091, 490449, 153025, 75.7, 5.45, synthetic_model{}});
    p.push_back({"delicious200k", 782585, 205443, 196606, 100095, 301.0, 75.5, synthetic_model{}});
    p.push_back({"wikilshtc325k", 1617899, 325056, 1778351, 587084, 42.0, 3.2, synthetic_model{}});
    // Amazon-3M's counts from the XC repository; its features per point are not published
    // there: Amazon-670K's (also product texts) stand in.
    p.push_back({"amazon3m", 337067, 2812281, 1717899, 742507, 75.7, 36.04, synthetic_model{}});
    p.push_back({"tiny", 2000, 500, 2000, 500, 30.0, 3.0, tiny_model()});
    return p;
}

// Vose's alias method: O(1) draws from a fixed discrete distribution.
class alias_table {
  public:
    alias_table() = default;
    explicit alias_table(const std::vector<double>& weights) {
        const size_t n = weights.size();
        HSLIDE_ASSERT(n > 0 && n <= UINT32_MAX);
        prob_.resize(n);
        alias_.resize(n);
        const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
        std::vector<double> scaled(n);
        std::vector<uint32_t> small, large;
        for (size_t i = 0; i < n; ++i) {
            scaled[i] = weights[i] * static_cast<double>(n) / total;
            (scaled[i] < 1.0 ? small : large).push_back(static_cast<uint32_t>(i));
        }
        while (!small.empty() && !large.empty()) {
            const uint32_t s = small.back(), l = large.back();
            small.pop_back();
            prob_[s] = scaled[s];
            alias_[s] = l;
            scaled[l] -= 1.0 - scaled[s];
            if (scaled[l] < 1.0) {
                large.pop_back();
                small.push_back(l);
            }
        }
        // Leftovers are 1 up to rounding.
        for (uint32_t i : small) prob_[i] = 1.0, alias_[i] = i;
        for (uint32_t i : large) prob_[i] = 1.0, alias_[i] = i;
    }
    uint32_t operator()(rng& gen) const {
        const uint64_t r = gen();
        const uint32_t i =
            static_cast<uint32_t>((static_cast<__uint128_t>(r) * prob_.size()) >> 64);
        // The low bits are nearly independent of the index taken from the high bits.
        const double u = static_cast<double>(r & 0xFFFFFFFFFULL) * (1.0 / 68719476736.0);
        return u < prob_[i] ? i : alias_[i];
    }

  private:
    std::vector<double> prob_;
    std::vector<uint32_t> alias_;
};

uint32_t fast_range(uint64_t hash, uint64_t n) {
    return static_cast<uint32_t>((static_cast<__uint128_t>(hash) * n) >> 64);
}

uint32_t poisson(rng& gen, double mean) {
    if (mean <= 0) return 0;
    if (mean < 30) {
        const double limit = std::exp(-mean);
        double p = 1.0;
        uint32_t k = 0;
        while (true) {
            p *= gen.uniform_double();
            if (p <= limit) return k;
            ++k;
        }
    }
    const double x = std::round(mean + std::sqrt(mean) * gen.normal());
    return x < 0 ? 0u : static_cast<uint32_t>(x);
}

// Counts feature tokens of one point; a generation stamp avoids clearing between points.
class token_counter {
  public:
    void reset(size_t expected) {
        size_t cap = 64;
        while (cap < 4 * expected) cap <<= 1;
        if (cap > keys_.size()) {
            keys_.assign(cap, 0);
            counts_.assign(cap, 0);
            stamps_.assign(cap, 0);
            stamp_ = 0;
        }
        mask_ = keys_.size() - 1;
        if (++stamp_ == 0) {  // wrapped: start over
            std::fill(stamps_.begin(), stamps_.end(), 0);
            stamp_ = 1;
        }
        used_.clear();
    }
    void add(uint32_t key) {
        size_t h = (static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ULL) >> 40 & mask_;
        while (stamps_[h] == stamp_ && keys_[h] != key) h = (h + 1) & mask_;
        if (stamps_[h] != stamp_) {
            stamps_[h] = stamp_;
            keys_[h] = key;
            counts_[h] = 1;
            used_.push_back(static_cast<uint32_t>(h));
        } else {
            ++counts_[h];
        }
    }
    size_t unique() const { return used_.size(); }
    const std::vector<uint32_t>& used() const { return used_; }
    uint32_t key(uint32_t slot) const { return keys_[slot]; }
    uint32_t count(uint32_t slot) const { return counts_[slot]; }

  private:
    std::vector<uint32_t> keys_, counts_, stamps_, used_;
    uint32_t stamp_ = 0;
    size_t mask_ = 0;
};

// Everything shared by all points of one generation run.
struct generator {
    synthetic_preset shape;
    synthetic_model m;
    uint32_t L = 0, D = 0, n_topics = 0;
    std::vector<uint32_t> label_id;     // rank -> id
    std::vector<uint32_t> topic_of;     // rank -> topic
    std::vector<uint32_t> topic_begin;  // CSR over topics of member ranks
    std::vector<uint32_t> topic_member;
    std::vector<double> topic_cumulative;  // cumulative prior within each topic
    std::vector<uint32_t> feature_id;      // noise rank -> id
    std::vector<float> idf;                // by feature id
    alias_table label_prior, noise_prior, slot_prior;
    uint64_t proto_seed = 0, pool_seed = 0;

    explicit generator(const synthetic_preset& preset, uint64_t seed)
        : shape(preset), m(preset.model) {
        L = static_cast<uint32_t>(shape.n_labels);
        D = static_cast<uint32_t>(shape.n_features);
        proto_seed = derive_seed(seed, 4);
        pool_seed = derive_seed(seed, 5);

        std::vector<double> w(L);
        for (uint32_t r = 0; r < L; ++r)
            w[r] = std::pow(r + 1.0 + m.label_offset, -m.label_exponent);
        label_prior = alias_table(w);
        label_id.resize(L);
        std::iota(label_id.begin(), label_id.end(), 0u);
        rng perm_gen(derive_seed(seed, 1));
        shuffle(label_id.begin(), label_id.end(), perm_gen);

        n_topics =
            static_cast<uint32_t>(std::max<uint64_t>(1, L / std::max<uint32_t>(1, m.topic_size)));
        rng topic_gen(derive_seed(seed, 3));
        topic_of.resize(L);
        topic_begin.assign(n_topics + 1, 0);
        for (uint32_t r = 0; r < L; ++r) {
            topic_of[r] = static_cast<uint32_t>(topic_gen.below(n_topics));
            ++topic_begin[topic_of[r] + 1];
        }
        for (uint32_t t = 0; t < n_topics; ++t) topic_begin[t + 1] += topic_begin[t];
        topic_member.resize(L);
        topic_cumulative.resize(L);
        std::vector<uint32_t> fill(topic_begin.begin(), topic_begin.end() - 1);
        for (uint32_t r = 0; r < L; ++r) topic_member[fill[topic_of[r]]++] = r;
        for (uint32_t t = 0; t < n_topics; ++t) {
            double sum = 0;
            for (uint32_t i = topic_begin[t]; i < topic_begin[t + 1]; ++i) {
                sum += w[topic_member[i]];
                topic_cumulative[i] = sum;
            }
        }

        std::vector<double> q(D);
        double q_total = 0;
        for (uint32_t s = 0; s < D; ++s) {
            q[s] = std::pow(s + 1.0 + m.feature_offset, -m.feature_exponent);
            q_total += q[s];
        }
        noise_prior = alias_table(q);
        feature_id.resize(D);
        std::iota(feature_id.begin(), feature_id.end(), 0u);
        rng feature_gen(derive_seed(seed, 2));
        shuffle(feature_id.begin(), feature_id.end(), feature_gen);
        idf.resize(D);
        for (uint32_t s = 0; s < D; ++s)
            idf[feature_id[s]] =
                static_cast<float>(std::log1p(1.0 / (shape.features_per_point * q[s] / q_total)));

        std::vector<double> slots(m.prototype_size);
        for (uint32_t j = 0; j < m.prototype_size; ++j)
            slots[j] = std::pow(j + 1.0, -m.prototype_decay);
        slot_prior = alias_table(slots);
    }

    // Feature of slot `slot` of the prototype of the label of rank `rank`.
    uint32_t prototype_feature(uint32_t rank, uint32_t slot) const {
        const uint64_t h =
            splitmix64(proto_seed + static_cast<uint64_t>(rank) * m.prototype_size + slot);
        if (static_cast<double>(h >> 40) * (1.0 / 16777216.0) < m.topic_share) {
            const uint64_t pool_slot = fast_range(h << 24, m.topic_pool_size);
            return fast_range(
                splitmix64(pool_seed + static_cast<uint64_t>(topic_of[rank]) * m.topic_pool_size +
                           pool_slot),
                D);
        }
        return fast_range(splitmix64(h), D);
    }

    uint32_t topic_label(rng& gen, uint32_t topic) const {
        const uint32_t b = topic_begin[topic], e = topic_begin[topic + 1];
        const double u = gen.uniform_double() * topic_cumulative[e - 1];
        const uint32_t i = static_cast<uint32_t>(
            std::upper_bound(topic_cumulative.begin() + b, topic_cumulative.begin() + e, u) -
            topic_cumulative.begin());
        return topic_member[std::min(i, e - 1)];
    }
};

// The points of one chunk, in CSR-like form without the leading offset.
struct chunk_points {
    std::vector<uint32_t> feature_count, feature_ids, label_count, label_ids;
    std::vector<float> feature_values;
};

void generate_chunk(const generator& g, rng& gen, uint64_t n_points, chunk_points& out,
                    token_counter& counter) {
    const double label_mean = std::max(0.0, g.shape.labels_per_point - 1.0);
    const double F = g.shape.features_per_point;
    const double sigma = g.m.features_sigma;
    const uint64_t max_features = std::max<uint64_t>(1, std::min<uint64_t>(g.D, std::ceil(10 * F)));
    std::vector<uint32_t> ranks;
    std::vector<std::pair<uint32_t, float>> feats;
    for (uint64_t p = 0; p < n_points; ++p) {
        // Labels.
        const uint32_t n_labels = std::min<uint32_t>(g.L, 1 + poisson(gen, label_mean));
        ranks.clear();
        ranks.push_back(g.label_prior(gen));
        const uint32_t topic = g.topic_of[ranks[0]];
        const bool topic_has_more = g.topic_begin[topic + 1] - g.topic_begin[topic] > 1;
        for (uint32_t attempts = 0; ranks.size() < n_labels && attempts < 20 * n_labels + 100;
             ++attempts) {
            const uint32_t r = (topic_has_more && gen.uniform_double() < g.m.label_coherence)
                                   ? g.topic_label(gen, topic)
                                   : g.label_prior(gen);
            if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) ranks.push_back(r);
        }

        // Features: tokens until the drawn number of distinct features is reached.
        const double size = F * std::exp(sigma * gen.normal() - 0.5 * sigma * sigma);
        const uint64_t target =
            std::clamp<uint64_t>(static_cast<uint64_t>(std::llround(size)), 1, max_features);
        counter.reset(target);
        const uint64_t max_tokens = 4 * target + 64;
        for (uint64_t t = 0; counter.unique() < target && t < max_tokens; ++t) {
            if (gen.uniform_double() < g.m.signal) {
                const uint32_t r = ranks[gen.below(ranks.size())];
                counter.add(g.prototype_feature(r, g.slot_prior(gen)));
            } else {
                counter.add(g.feature_id[g.noise_prior(gen)]);
            }
        }
        feats.clear();
        double norm = 0;
        for (uint32_t slot : counter.used()) {
            const uint32_t f = counter.key(slot);
            const float v = static_cast<float>((1.0 + std::log(counter.count(slot))) * g.idf[f] *
                                               (0.75 + 0.5 * gen.uniform_double()));
            feats.emplace_back(f, v);
            norm += static_cast<double>(v) * v;
        }
        std::sort(feats.begin(), feats.end());
        const double inv = 1.0 / std::sqrt(norm);
        for (const auto& [f, v] : feats) {
            // Five decimals: short in text and bit-identical after a write/read round trip.
            const double q = std::max(1.0, std::round(v * inv * 1e5));
            out.feature_ids.push_back(f);
            out.feature_values.push_back(static_cast<float>(q / 1e5));
        }
        out.feature_count.push_back(static_cast<uint32_t>(feats.size()));

        const size_t label_begin = out.label_ids.size();
        for (uint32_t r : ranks) out.label_ids.push_back(g.label_id[r]);
        std::sort(out.label_ids.begin() + label_begin, out.label_ids.end());
        out.label_count.push_back(static_cast<uint32_t>(ranks.size()));
    }
}

dataset generate_split(const generator& g, uint64_t n_points, uint64_t split_seed, progress* bar) {
    const uint64_t n_chunks = (n_points + synthetic_chunk_points - 1) / synthetic_chunk_points;
    std::vector<chunk_points> chunks(n_chunks);
#pragma omp parallel
    {
        token_counter counter;
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < static_cast<int64_t>(n_chunks); ++c) {
            rng gen(derive_seed(split_seed, static_cast<uint64_t>(c)));
            const uint64_t begin = static_cast<uint64_t>(c) * synthetic_chunk_points;
            const uint64_t count = std::min(synthetic_chunk_points, n_points - begin);
            generate_chunk(g, gen, count, chunks[c], counter);
            if (bar) bar->add(count);
        }
    }

    dataset data;
    data.source = "synthetic:" + g.shape.name;
    data.n_features = g.D;
    data.n_labels = g.L;
    std::vector<uint64_t> f_base(n_chunks + 1, 0), l_base(n_chunks + 1, 0);
    for (uint64_t c = 0; c < n_chunks; ++c) {
        f_base[c + 1] = f_base[c] + chunks[c].feature_ids.size();
        l_base[c + 1] = l_base[c] + chunks[c].label_ids.size();
    }
    data.feature_offsets.assign(n_points + 1, 0);
    data.label_offsets.assign(n_points + 1, 0);
    data.feature_ids.resize(f_base[n_chunks]);
    data.feature_values.resize(f_base[n_chunks]);
    data.label_ids.resize(l_base[n_chunks]);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t c = 0; c < static_cast<int64_t>(n_chunks); ++c) {
        chunk_points& ch = chunks[c];
        const uint64_t first = static_cast<uint64_t>(c) * synthetic_chunk_points;
        uint64_t fo = f_base[c], lo = l_base[c];
        for (size_t i = 0; i < ch.feature_count.size(); ++i) {
            fo += ch.feature_count[i];
            lo += ch.label_count[i];
            data.feature_offsets[first + i + 1] = fo;
            data.label_offsets[first + i + 1] = lo;
        }
        std::copy(ch.feature_ids.begin(), ch.feature_ids.end(),
                  data.feature_ids.begin() + f_base[c]);
        std::copy(ch.feature_values.begin(), ch.feature_values.end(),
                  data.feature_values.begin() + f_base[c]);
        std::copy(ch.label_ids.begin(), ch.label_ids.end(), data.label_ids.begin() + l_base[c]);
        ch = chunk_points{};  // free as we go
    }
    return data;
}

}  // namespace

const std::vector<synthetic_preset>& synthetic_presets() {
    static const std::vector<synthetic_preset> presets = make_presets();
    return presets;
}

const synthetic_preset& find_synthetic_preset(const std::string& name) {
    std::string valid;
    for (const auto& p : synthetic_presets()) {
        if (p.name == name) return p;
        valid += (valid.empty() ? "" : ", ") + p.name;
    }
    throw error(error_kind::invalid_argument,
                fmt::format("unknown synthetic preset '{}' (valid: {})", name, valid));
}

synthetic_preset resolve_synthetic(const synthetic_config& config) {
    synthetic_preset p = find_synthetic_preset(config.preset);
    HSLIDE_CHECK(std::isfinite(config.scale) && config.scale > 0,
                 "synthetic scale must be a positive number, got {}", config.scale);
    if (config.n_labels) p.n_labels = config.n_labels;
    if (config.n_features) p.n_features = config.n_features;
    if (config.model) p.model = *config.model;
    HSLIDE_CHECK(p.n_labels <= UINT32_MAX && p.n_features <= UINT32_MAX,
                 "synthetic: at most {} labels and features", UINT32_MAX);
    const auto scaled = [&](uint64_t n) {
        const double points = double(n) * config.scale;
        // Point indices are 32-bit everywhere; checked in double so llround cannot overflow.
        HSLIDE_CHECK(points < double(UINT32_MAX),
                     "synthetic scale {} gives {:.3g} points; at most {} are supported",
                     config.scale, points, UINT32_MAX);
        return std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(points)));
    };
    p.n_train = config.n_train ? config.n_train : scaled(p.n_train);
    p.n_test = config.n_test ? config.n_test : scaled(p.n_test);
    HSLIDE_CHECK(p.n_train < UINT32_MAX && p.n_test < UINT32_MAX,
                 "synthetic point counts must be below {} (got {} train, {} test)", UINT32_MAX,
                 p.n_train, p.n_test);
    const synthetic_model& m = p.model;
    HSLIDE_CHECK(m.label_exponent >= 0 && m.label_offset >= 0 && m.feature_exponent >= 0 &&
                     m.feature_offset >= 0 && m.prototype_decay >= 0,
                 "synthetic: exponents and offsets must be >= 0");
    HSLIDE_CHECK(m.prototype_size >= 1 && m.topic_size >= 1 && m.topic_pool_size >= 1,
                 "synthetic: prototype_size, topic_size and topic_pool_size must be >= 1");
    HSLIDE_CHECK(m.topic_share >= 0 && m.topic_share <= 1 && m.label_coherence >= 0 &&
                     m.label_coherence <= 1 && m.signal >= 0 && m.signal <= 1,
                 "synthetic: topic_share, label_coherence and signal must be in [0, 1]");
    HSLIDE_CHECK(m.features_sigma >= 0 && m.features_sigma <= 3,
                 "synthetic: features_sigma must be in [0, 3]");
    return p;
}

namespace {
// The CSR bytes the points of `shape` take in memory: sized up front, as a model is, so that
// a --scale too large is refused at once with the bytes it needs instead of growing towards the
// OOM killer for hours.
uint64_t synthetic_bytes(const synthetic_preset& shape) {
    const double points = double(shape.n_train) + double(shape.n_test);
    return uint64_t(points * (2 * sizeof(uint64_t) + shape.features_per_point * 8 +
                              shape.labels_per_point * 4));
}

std::string describe(const synthetic_preset& shape) {
    return fmt::format(
        "the synthetic '{}' data ({} train and {} test points of ~{:.0f} features "
        "and ~{:.1f} labels)",
        shape.name, shape.n_train, shape.n_test, shape.features_per_point, shape.labels_per_point);
}
}  // namespace

synthetic_data generate_synthetic(const synthetic_config& config, bool show_progress) {
    const synthetic_preset shape = resolve_synthetic(config);
    check_host_allocation(describe(shape), synthetic_bytes(shape));
    const generator g(shape, config.seed);
    progress bar("generate " + shape.name, shape.n_train + shape.n_test, "points", show_progress);
    synthetic_data out;
    out.train = generate_split(g, shape.n_train, derive_seed(config.seed, 101), &bar);
    out.test = generate_split(g, shape.n_test, derive_seed(config.seed, 102), &bar);
    bar.finish();
    return out;
}

void generate_synthetic_files(const synthetic_config& config, const std::string& dir,
                              bool show_progress) {
    // The text takes ~12 bytes per feature (id, ':', value, space) and what memory the points
    // need (generate_synthetic): refused before anything is made, the folder included.
    const synthetic_preset shape = resolve_synthetic(config);
    check_host_allocation(describe(shape), synthetic_bytes(shape));
    const double text_bytes = (double(shape.n_train) + double(shape.n_test)) *
                              (shape.features_per_point * 12 + shape.labels_per_point * 7 + 1);
    std::filesystem::path existing = std::filesystem::absolute(dir);
    while (!std::filesystem::exists(existing) && existing.has_parent_path() &&
           existing.parent_path() != existing)
        existing = existing.parent_path();
    struct statvfs fs {};
    if (::statvfs(existing.c_str(), &fs) == 0) {
        const double free_bytes = double(fs.f_bavail) * double(fs.f_frsize);
        HSLIDE_CHECK_KIND(text_bytes <= free_bytes, error_kind::io,
                          "{} would take ~{:.3g} GB as text but {} has {:.3g} GB free",
                          describe(shape), text_bytes / 1e9, existing.string(), free_bytes / 1e9);
    }
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    HSLIDE_CHECK_KIND(!ec && std::filesystem::is_directory(dir), error_kind::io,
                      "cannot create directory {}: {}", dir, ec ? ec.message() : "not a directory");
    const synthetic_data data = generate_synthetic(config, show_progress);
    write_xc(data.train, dir + "/train.txt");
    write_xc(data.test, dir + "/test.txt");
}

learnability_report measure_learnability(const dataset& train, const dataset& test,
                                         uint64_t max_test_points) {
    HSLIDE_CHECK(train.n_labels == test.n_labels && train.n_features == test.n_features,
                 "measure_learnability: train and test shapes differ");
    HSLIDE_CHECK(train.size() > 0 && test.size() > 0, "measure_learnability: empty dataset");
    const uint64_t L = train.n_labels, D = train.n_features;
    learnability_report rep;
    rep.train_features_per_point = static_cast<double>(train.feature_ids.size()) / train.size();
    rep.train_labels_per_point = static_cast<double>(train.label_ids.size()) / train.size();

    std::vector<uint64_t> label_count(L, 0);
    for (uint32_t l : train.label_ids) ++label_count[l];
    std::vector<uint32_t> by_count(L);
    std::iota(by_count.begin(), by_count.end(), 0u);
    std::stable_sort(by_count.begin(), by_count.end(),
                     [&](uint32_t a, uint32_t b) { return label_count[a] > label_count[b]; });
    const uint32_t top = by_count[0];
    rep.labels_seen_fraction =
        static_cast<double>(std::count_if(label_count.begin(), label_count.end(),
                                          [](uint64_t c) { return c > 0; })) /
        L;
    rep.top_label_point_fraction = static_cast<double>(label_count[top]) / train.size();
    const auto coverage = [&](double fraction) {
        const uint64_t k = std::max<uint64_t>(1, static_cast<uint64_t>(fraction * L));
        uint64_t sum = 0;
        for (uint64_t i = 0; i < k; ++i) sum += label_count[by_count[i]];
        return train.label_ids.empty() ? 0.0 : static_cast<double>(sum) / train.label_ids.size();
    };
    rep.top1pct_coverage = coverage(0.01);
    rep.top5pct_coverage = coverage(0.05);

    // Inverted index of the label centroids: feature -> (label, summed value). Built from the
    // point index feature -> (point, value), one feature at a time, so no triple list of
    // (label, feature, value) ever exists.
    std::vector<uint64_t> point_begin(D + 1, 0);
    for (uint32_t f : train.feature_ids) ++point_begin[f + 1];
    for (uint64_t f = 0; f < D; ++f) point_begin[f + 1] += point_begin[f];
    std::vector<uint32_t> point_of(train.feature_ids.size());
    std::vector<float> point_value(train.feature_ids.size());
    {
        std::vector<uint64_t> fill(point_begin.begin(), point_begin.end() - 1);
        for (size_t p = 0; p < train.size(); ++p) {
            const feature_row row = train.features(p);
            for (uint32_t i = 0; i < row.count; ++i) {
                const uint64_t at = fill[row.ids[i]]++;
                point_of[at] = static_cast<uint32_t>(p);
                point_value[at] = row.values[i];
            }
        }
    }
    std::vector<std::vector<std::pair<uint32_t, float>>> centroid(D);
#pragma omp parallel
    {
        std::vector<std::pair<uint32_t, float>> scratch;
#pragma omp for schedule(dynamic, 256)
        for (int64_t f = 0; f < static_cast<int64_t>(D); ++f) {
            scratch.clear();
            for (uint64_t i = point_begin[f]; i < point_begin[f + 1]; ++i) {
                const label_row labels = train.labels(point_of[i]);
                for (uint32_t j = 0; j < labels.count; ++j)
                    scratch.emplace_back(labels.ids[j], point_value[i]);
            }
            std::sort(scratch.begin(), scratch.end(),
                      [](const auto& a, const auto& b) { return a.first < b.first; });
            auto& out = centroid[f];
            for (const auto& [l, v] : scratch) {
                if (!out.empty() && out.back().first == l)
                    out.back().second += v;
                else
                    out.emplace_back(l, v);
            }
            out.shrink_to_fit();
        }
    }
    point_of = {};
    point_value = {};

    const uint64_t n_test =
        max_test_points ? std::min<uint64_t>(max_test_points, test.size()) : test.size();
    rep.test_points = n_test;
    const uint32_t top5_n = static_cast<uint32_t>(std::min<uint64_t>(5, L));
    uint64_t hit_freq = 0, hit_centroid = 0, hit_top5 = 0, hit_tenth = 0;
#pragma omp parallel reduction(+ : hit_freq, hit_centroid, hit_top5, hit_tenth)
    {
        std::vector<float> score(L, 0.0f), score_tenth(L, 0.0f);
        std::vector<uint32_t> touched;
        std::vector<uint8_t> is_touched(L, 0);
#pragma omp for schedule(dynamic, 64)
        for (int64_t t = 0; t < static_cast<int64_t>(n_test); ++t) {
            const feature_row x = test.features(t);
            const label_row truth = test.labels(t);
            const auto has = [&](uint32_t l) {
                return std::find(truth.ids, truth.ids + truth.count, l) != truth.ids + truth.count;
            };
            for (uint32_t i = 0; i < x.count; ++i) {
                const bool kept = x.ids[i] % 10 == 0;
                for (const auto& [l, v] : centroid[x.ids[i]]) {
                    if (!is_touched[l]) {
                        is_touched[l] = 1;
                        touched.push_back(l);
                    }
                    score[l] += x.values[i] * v;
                    if (kept) score_tenth[l] += x.values[i] * v;
                }
            }
            uint32_t best = top, best_tenth = top;
            float best_score = 0, best_tenth_score = 0;
            for (uint32_t l : touched) {
                if (score[l] > best_score) best_score = score[l], best = l;
                if (score_tenth[l] > best_tenth_score)
                    best_tenth_score = score_tenth[l], best_tenth = l;
            }
            uint32_t best5 = by_count[0];
            for (uint32_t k = 1; k < top5_n; ++k)
                if (score[by_count[k]] > score[best5]) best5 = by_count[k];
            hit_freq += has(top);
            hit_centroid += has(best);
            hit_top5 += has(best5);
            hit_tenth += has(best_tenth);
            for (uint32_t l : touched) score[l] = 0, score_tenth[l] = 0, is_touched[l] = 0;
            touched.clear();
        }
    }
    rep.p1_most_frequent = static_cast<double>(hit_freq) / n_test;
    rep.p1_centroid = static_cast<double>(hit_centroid) / n_test;
    rep.p1_centroid_top5 = static_cast<double>(hit_top5) / n_test;
    rep.p1_centroid_tenth = static_cast<double>(hit_tenth) / n_test;
    return rep;
}

}  // namespace hslide
