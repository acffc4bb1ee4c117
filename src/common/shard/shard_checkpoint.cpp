// Sharded checkpoints: each rank's file and rank 0's manifest (shard_checkpoint.hpp).
#include "hslide/shard_checkpoint.hpp"

#include "hslide/error.hpp"
#include "hslide/output_file.hpp"

#include <nlohmann/json.hpp>

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
    std::ifstream in(path, std::ios::binary);
    char head[64] = {};
    in.read(head, sizeof head - 1);
    return std::strstr(head, manifest_key) != nullptr;
}

checkpoint_contents load_shard_checkpoint(shard_comm& comm, const std::string& path,
                                          output_shard& shard) {
    std::ifstream in(path, std::ios::binary);
    HSLIDE_CHECK_KIND(bool(in), error_kind::bad_input, "{}: cannot open the sharded checkpoint",
                      path);
    std::stringstream text;
    text << in.rdbuf();
    nlohmann::json m;
    int ranks = 0;
    uint32_t rows = 0;
    std::vector<uint32_t> bounds;
    std::string file, checksum;
    try {
        m = nlohmann::json::parse(text.str());
        HSLIDE_CHECK_KIND(m.value(manifest_key, 0) == 1, error_kind::bad_input,
                          "not a sharded checkpoint's manifest");
        ranks = m.at("ranks").get<int>();
        rows = m.at("rows").get<uint32_t>();
        const auto& shards = m.at("shards");
        HSLIDE_CHECK_KIND(ranks >= 1 && shards.size() == size_t(ranks), error_kind::bad_input,
                          "{} shards for {} ranks", shards.size(), ranks);
        for (int r = 0; r < ranks; ++r) {
            const auto& e = shards.at(size_t(r));
            HSLIDE_CHECK_KIND(e.at("rank").get<int>() == r, error_kind::bad_input,
                              "shard {} is listed as rank {}", r, e.at("rank").get<int>());
            const uint32_t first = e.at("first").get<uint32_t>();
            HSLIDE_CHECK_KIND(first == (bounds.empty() ? 0 : bounds.back()), error_kind::bad_input,
                              "shard {}'s rows do not follow shard {}'s", r, r - 1);
            if (bounds.empty()) bounds.push_back(0);
            bounds.push_back(first + e.at("count").get<uint32_t>());
            if (r == comm.rank()) {
                file = e.at("file").get<std::string>();
                checksum = e.at("checksum").get<std::string>();
            }
        }
        HSLIDE_CHECK_KIND(bounds.back() == rows, error_kind::bad_input,
                          "the shards hold {} rows of {}", bounds.back(), rows);
    } catch (const nlohmann::json::exception& e) {
        throw input_error(path, 0, fmt::format("bad sharded checkpoint manifest: {}", e.what()));
    } catch (const error& e) {
        throw input_error(path, 0, e.what());
    }
    if (ranks != comm.size())
        throw input_error(path, 0,
                          fmt::format("a checkpoint of {} ranks; resume it with mpirun -np {} "
                                      "(this run has {})",
                                      ranks, ranks, comm.size()));
    const std::string shard_path = folder_of(path) + file;
    const std::string found = file_checksum(shard_path);
    if (found != checksum)
        throw input_error(shard_path, 0,
                          fmt::format("its checksum {} is not the manifest's {} ({}): the ranks' "
                                      "files are of different saves",
                                      found, checksum, path));
    checkpoint_contents c = load_checkpoint(shard_path);
    const uint32_t first = bounds[size_t(comm.rank())];
    const uint32_t count = bounds[size_t(comm.rank()) + 1] - first;
    if (!c.model.holds_output_shard() || c.model.output_first != first ||
        c.model.layers.back().rows != count || c.model.config.output_dim() != rows)
        throw input_error(shard_path, 0,
                          fmt::format("it holds output rows [{}, {}), the manifest says [{}, {}) "
                                      "of {}",
                                      c.model.output_first,
                                      uint64_t(c.model.output_first) + c.model.layers.back().rows,
                                      first, uint64_t(first) + count, rows));
    shard.comm = &comm;
    shard.total = rows;
    shard.bounds = bounds;
    shard.first = first;
    shard.count = count;
    return c;
}

}  // namespace hslide
