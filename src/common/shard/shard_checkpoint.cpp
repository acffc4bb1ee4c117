// Sharded checkpoints: each rank's file and rank 0's manifest (shard_checkpoint.hpp).
#include "hslide/shard_checkpoint.hpp"

#include "hslide/error.hpp"
#include "hslide/memory.hpp"
#include "hslide/output_file.hpp"

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

namespace hslide {

namespace {

constexpr const char* manifest_key = "hslide_sharded_checkpoint";

/// The file's XXH3 trailer (checkpoint_file.hpp: its last 8 bytes), as 16 hex digits.
std::string file_checksum(const std::string& path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    HSLIDE_CHECK_KIND(in && in.tellg() >= 8, error_kind::bad_input,
                      "{}: cannot read its checksum (missing or too short)", path);
    in.seekg(-8, std::ios::end);
    unsigned char bytes[8];
    in.read(reinterpret_cast<char*>(bytes), 8);
    HSLIDE_CHECK_KIND(bool(in), error_kind::io, "{}: cannot read its checksum", path);
    std::string hex;
    for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
    return hex;
}

/// The file name alone (the manifest names the files beside it).
std::string base_name(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string folder_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

}  // namespace

std::string shard_checkpoint_path(const std::string& path, int rank, int ranks) {
    return fmt::format("{}.rank{}-of-{}", path, rank, ranks);
}

void write_shard_manifest(shard_comm& comm, const std::string& path, const output_shard& shard) {
    const int ranks = comm.size();
    char mine[16];
    const std::string checksum = file_checksum(shard_checkpoint_path(path, comm.rank(), ranks));
    std::memcpy(mine, checksum.data(), 16);
    std::vector<char> all(size_t(ranks) * 16);
    comm.all_gather(mine, 16, all.data());
    if (comm.rank() != 0) return;
    nlohmann::json m;
    m[manifest_key] = 1;
    m["ranks"] = ranks;
    m["rows"] = shard.total;
    for (int r = 0; r < ranks; ++r)
        m["shards"].push_back({{"rank", r},
                               {"file", base_name(shard_checkpoint_path(path, r, ranks))},
                               {"first", shard.bounds[size_t(r)]},
                               {"count", shard.bounds[size_t(r) + 1] - shard.bounds[size_t(r)]},
                               {"checksum", std::string(all.data() + size_t(r) * 16, 16)}});
    output_file out(path, /*durable=*/true);
    out.write(m.dump(1) + "\n");
    out.commit();
}

bool is_shard_manifest(const std::string& path) {
    // Only a regular file is read (a FIFO would block here; the checkpoint loader refuses it).
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    std::ifstream in(path, std::ios::binary);
    char head[64] = {};
    in.read(head, sizeof head - 1);
    return std::strstr(head, manifest_key) != nullptr;
}

shard_manifest read_shard_manifest(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    HSLIDE_CHECK_KIND(bool(in), error_kind::bad_input, "{}: cannot open the sharded checkpoint",
                      path);
    std::stringstream text;
    text << in.rdbuf();
    shard_manifest m;
    try {
        const nlohmann::json j = nlohmann::json::parse(text.str());
        HSLIDE_CHECK_KIND(j.value(manifest_key, 0) == 1, error_kind::bad_input,
                          "not a sharded checkpoint's manifest");
        m.ranks = j.at("ranks").get<int>();
        m.rows = j.at("rows").get<uint32_t>();
        const auto& shards = j.at("shards");
        HSLIDE_CHECK_KIND(m.ranks >= 1 && shards.size() == size_t(m.ranks), error_kind::bad_input,
                          "{} shards for {} ranks", shards.size(), m.ranks);
        m.bounds.push_back(0);
        for (int r = 0; r < m.ranks; ++r) {
            const auto& e = shards.at(size_t(r));
            HSLIDE_CHECK_KIND(e.at("rank").get<int>() == r, error_kind::bad_input,
                              "shard {} is listed as rank {}", r, e.at("rank").get<int>());
            const uint32_t first = e.at("first").get<uint32_t>();
            const uint32_t count = e.at("count").get<uint32_t>();
            HSLIDE_CHECK_KIND(first == m.bounds.back(), error_kind::bad_input,
                              "shard {}'s rows do not follow shard {}'s", r, r - 1);
            HSLIDE_CHECK_KIND(count > 0 && count <= m.rows - first, error_kind::bad_input,
                              "shard {} holds rows [{}, {}) of {}", r, first,
                              uint64_t(first) + count, m.rows);
            m.bounds.push_back(first + count);
            m.files.push_back(folder_of(path) + e.at("file").get<std::string>());
            m.checksums.push_back(e.at("checksum").get<std::string>());
        }
        HSLIDE_CHECK_KIND(m.bounds.back() == m.rows, error_kind::bad_input,
                          "the shards hold {} rows of {}", m.bounds.back(), m.rows);
    } catch (const nlohmann::json::exception& e) {
        throw input_error(path, 0, fmt::format("bad sharded checkpoint manifest: {}", e.what()));
    } catch (const error& e) {
        throw input_error(path, 0, e.what());
    }
    return m;
}

namespace {

/// Rank r's file of the manifest `m` (at `path`), checked against it: its checksum, and the
/// rows it holds.
checkpoint_contents load_rank_file(const shard_manifest& m, const std::string& path, int r) {
    const std::string& file = m.files[size_t(r)];
    const std::string found = file_checksum(file);
    if (found != m.checksums[size_t(r)])
        throw input_error(file, 0,
                          fmt::format("its checksum {} is not the manifest's {} ({}): the ranks' "
                                      "files are of different saves",
                                      found, m.checksums[size_t(r)], path));
    checkpoint_contents c = load_checkpoint(file);
    const uint32_t first = m.bounds[size_t(r)];
    const uint32_t count = m.bounds[size_t(r) + 1] - first;
    if (c.model.output_first != first || c.model.layers.back().rows != count ||
        c.model.config.output_dim() != m.rows)
        throw input_error(file, 0,
                          fmt::format("it holds output rows [{}, {}), the manifest says [{}, {}) "
                                      "of {}",
                                      c.model.output_first,
                                      uint64_t(c.model.output_first) + c.model.layers.back().rows,
                                      first, uint64_t(first) + count, m.rows));
    return c;
}

/// A layer of `count` rows shaped like `like` (zeros), with Adam moments when `moments`.
layer_state rows_like(const layer_state& like, uint32_t count, bool moments) {
    layer_state out;
    out.rows = count;
    out.width = like.width;
    out.stride = like.stride;
    const size_t n = size_t(count) * like.stride;
    out.weights.resize(n);
    out.bias.assign(count, 0.0f);
    if (moments) {
        out.adam_m.resize(n);
        out.adam_v.resize(n);
        out.bias_m.assign(count, 0.0f);
        out.bias_v.assign(count, 0.0f);
    }
    return out;
}

/// Copies `count` rows from src's row `from` to dst's row `to` (weights and biases, and the
/// moments where both have them).
void copy_layer_rows(const layer_state& src, uint32_t from, layer_state& dst, uint32_t to,
                     uint32_t count) {
    const size_t bytes = size_t(count) * src.stride * sizeof(float);
    const size_t at = size_t(from) * src.stride, into = size_t(to) * dst.stride;
    std::memcpy(dst.weights.data() + into, src.weights.data() + at, bytes);
    std::copy_n(src.bias.begin() + from, count, dst.bias.begin() + to);
    if (dst.adam_m.size() && src.adam_m.size() == size_t(src.rows) * src.stride) {
        std::memcpy(dst.adam_m.data() + into, src.adam_m.data() + at, bytes);
        std::memcpy(dst.adam_v.data() + into, src.adam_v.data() + at, bytes);
    }
    if (dst.bias_m.size() && src.bias_m.size() == src.rows) {
        std::copy_n(src.bias_m.begin() + from, count, dst.bias_m.begin() + to);
        std::copy_n(src.bias_v.begin() + from, count, dst.bias_v.begin() + to);
    }
}

bool has_moments(const layer_state& layer) {
    return layer.adam_m.size() == size_t(layer.rows) * layer.stride &&
           layer.bias_m.size() == layer.rows;
}

void drop_moments(model_state& model) {
    for (layer_state& layer : model.layers) {
        layer.adam_m.resize(0);
        layer.adam_v.resize(0);
        std::vector<float>().swap(layer.bias_m);
        std::vector<float>().swap(layer.bias_v);
    }
}

}  // namespace

checkpoint_contents load_shard_checkpoint(shard_comm& comm, const std::string& path,
                                          output_shard& shard) {
    const shard_manifest m = read_shard_manifest(path);
    if (m.ranks != comm.size())
        throw input_error(path, 0,
                          fmt::format("a checkpoint of {} ranks; resume it with mpirun -np {} "
                                      "(this run has {})",
                                      m.ranks, m.ranks, comm.size()));
    checkpoint_contents c = load_rank_file(m, path, comm.rank());
    shard = make_output_shard(comm, m.bounds);
    return c;
}

checkpoint_contents load_shard_rows(const std::string& path, uint32_t first, uint32_t count,
                                    bool with_optimizer) {
    const shard_manifest m = read_shard_manifest(path);
    HSLIDE_CHECK(count > 0 && first < m.rows && count <= m.rows - first,
                 "{}: rows [{}, {}) asked of an output layer of {}", path, first,
                 uint64_t(first) + count, m.rows);
    checkpoint_contents out;
    layer_state rows;
    bool started = false;
    for (int r = 0; r < m.ranks; ++r) {
        const uint32_t lo = std::max(first, m.bounds[size_t(r)]);
        const uint32_t hi = std::min(first + count, m.bounds[size_t(r) + 1]);
        if (lo >= hi) continue;
        checkpoint_contents c = load_rank_file(m, path, r);
        if (!with_optimizer) drop_moments(c.model);
        const layer_state& held = c.model.layers.back();
        if (!started) {
            const bool moments = with_optimizer && has_moments(held);
            const uint64_t bytes =
                uint64_t(count) * held.stride * sizeof(float) * (moments ? 3 : 1);
            rows = allocate_checked(fmt::format("{}: output rows [{}, {}) of {}", path, first,
                                                uint64_t(first) + count, m.rows),
                                    bytes, [&] { return rows_like(held, count, moments); });
        }
        copy_layer_rows(held, lo - m.bounds[size_t(r)], rows, lo - first, hi - lo);
        c.model.layers.back() = layer_state{};  // this file's rows are copied: freed now
        if (!started) out = std::move(c);
        started = true;
    }
    out.model.layers.back() = std::move(rows);
    out.model.output_first = first;
    return out;
}

checkpoint_contents load_for_scoring(shard_comm& comm, const std::string& path,
                                     output_shard& shard) {
    const bool ranks = comm.size() > 1;
    shard = output_shard{};
    if (!is_shard_manifest(path)) {
        checkpoint_contents c = load_checkpoint(path);
        if (ranks) {
            shard = make_output_shard(comm, c.model.config.output_dim(), "");
            keep_output_rows(c.model, shard.first, shard.count);
        }
        return c;
    }
    const shard_manifest m = read_shard_manifest(path);
    if (!ranks) return load_shard_rows(path, 0, m.rows, /*with_optimizer=*/false);
    shard = make_output_shard(
        comm, m.ranks == comm.size() ? m.bounds : shard_bounds(m.rows, comm.size(), {}));
    return load_shard_rows(path, shard.first, shard.count, /*with_optimizer=*/false);
}

void keep_output_rows(model_state& model, uint32_t first, uint32_t count) {
    layer_state& held = model.layers.back();
    const uint32_t held_first = model.output_first;
    HSLIDE_CHECK(count > 0 && first >= held_first && count <= held.rows &&
                     first - held_first <= held.rows - count,
                 "output rows [{}, {}) asked of a model holding [{}, {})", first,
                 uint64_t(first) + count, held_first, uint64_t(held_first) + held.rows);
    if (first == held_first && count == held.rows) return;
    layer_state kept = rows_like(held, count, has_moments(held));
    copy_layer_rows(held, first - held_first, kept, 0, count);
    held = std::move(kept);
    model.output_first = first;
}

}  // namespace hslide
