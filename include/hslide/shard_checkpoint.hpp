// Checkpoints of a label-sharded run (issue 32): every rank writes its own checkpoint file
// (checkpoint.hpp: the replicated layers, its rows of the output layer with their Adam state,
// the trainer's state) beside PATH as PATH.rank<r>-of-<N>, atomically; then rank 0 writes PATH,
// a small JSON manifest naming each rank's file, rows and the file's checksum (its XXH3
// trailer), atomically too. A crash between the two leaves the previous manifest, whose
// checksums no longer match the files written since: the resume says so rather than mixing
// epochs. `--resume PATH` under the same number of ranks loads each rank's file, checked
// against the manifest, and continues as the uninterrupted run.
#pragma once

#include "hslide/checkpoint.hpp"
#include "hslide/output_shard.hpp"
#include "hslide/shard_comm.hpp"

#include <string>

namespace hslide {

/// Rank `rank` of `ranks`'s checkpoint file of the sharded checkpoint PATH.
std::string shard_checkpoint_path(const std::string& path, int rank, int ranks);

/// After every rank saved its file (shard_checkpoint_path): gathers the files' checksums and,
/// on rank 0, writes the manifest PATH. Every rank calls it.
void write_shard_manifest(shard_comm& comm, const std::string& path, const output_shard& shard);

/// Whether `path` is a sharded checkpoint's manifest (rather than a checkpoint).
bool is_shard_manifest(const std::string& path);

/// This rank's part of the sharded checkpoint PATH: its file, checked against the manifest
/// (ranks, rows, checksum); `shard` becomes the manifest's split (its --shard-weights). Throws
/// hslide::input_error naming the file and the mismatch.
checkpoint_contents load_shard_checkpoint(shard_comm& comm, const std::string& path,
                                          output_shard& shard);

}  // namespace hslide
