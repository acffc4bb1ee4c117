// Checkpoints of a label-sharded run (issue 32): every rank writes its own checkpoint file
// (checkpoint.hpp: the replicated layers, its rows of the output layer with their Adam state,
// the trainer's state) beside PATH as PATH.rank<r>-of-<N>, atomically; then rank 0 writes PATH,
// a small JSON manifest naming each rank's file, rows and the file's checksum (its XXH3
// trailer), atomically too. A crash between the two leaves the previous manifest, whose
// checksums no longer match the files written since: the resume says so rather than mixing
// epochs. `--resume PATH` under the same number of ranks loads each rank's file, checked
// against the manifest, and continues as the uninterrupted run.
//
// Scoring a sharded checkpoint (`hslide eval|predict --model PATH`): under as many ranks each
// loads its own file (load_shard_checkpoint); under another number, or in one process, each
// takes its rows from the files that hold them (load_shard_rows: one process assembles the
// whole model, rows [0, rows), when it fits in memory).
#pragma once

#include "hslide/checkpoint.hpp"
#include "hslide/output_shard.hpp"
#include "hslide/shard_comm.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace hslide {

/// Rank `rank` of `ranks`'s checkpoint file of the sharded checkpoint PATH.
std::string shard_checkpoint_path(const std::string& path, int rank, int ranks);

/// After every rank saved its file (shard_checkpoint_path): gathers the files' checksums and,
/// on rank 0, writes the manifest PATH. Every rank calls it.
void write_shard_manifest(shard_comm& comm, const std::string& path, const output_shard& shard);

/// Whether `path` is a sharded checkpoint's manifest (rather than a checkpoint): a regular file
/// that says so (anything else, a FIFO included, is left to the checkpoint loader unread).
bool is_shard_manifest(const std::string& path);

/// What a manifest says.
struct shard_manifest {
    int ranks = 0;
    uint32_t rows = 0;                   ///< the whole output layer's
    std::vector<uint32_t> bounds;        ///< rank r holds rows [bounds[r], bounds[r + 1])
    std::vector<std::string> files;      ///< rank r's file (a path: beside the manifest)
    std::vector<std::string> checksums;  ///< each file's XXH3 trailer, 16 hex digits
};

/// Reads and checks the manifest PATH (ranks, rows that follow each other and cover the
/// layer); throws hslide::input_error naming it and the problem.
shard_manifest read_shard_manifest(const std::string& path);

/// This rank's part of the sharded checkpoint PATH: its file, checked against the manifest
/// (ranks, rows, checksum); `shard` becomes the manifest's split (its --shard-weights). Throws
/// hslide::input_error naming the file and the mismatch.
checkpoint_contents load_shard_checkpoint(shard_comm& comm, const std::string& path,
                                          output_shard& shard);

/// Rows [first, first + count) of the sharded checkpoint PATH's output layer, read from the
/// ranks' files that hold them (each checked against the manifest: checksum and rows), with
/// the replicated layers, hash seeds, Adam step and trainer state of the first of them;
/// output_first = first. (0, rows) is the whole model (holds_output_shard() false). Without
/// `with_optimizer` no Adam moments are kept (scoring needs none): a file's are freed before
/// the next is read, so the peak is the rows asked for and one rank's file.
checkpoint_contents load_shard_rows(const std::string& path, uint32_t first, uint32_t count,
                                    bool with_optimizer);

/// The checkpoint PATH (a checkpoint, or a sharded one's manifest) as `comm`'s ranks score it
/// (hslide eval|predict): in a group of one, the whole model (a sharded checkpoint assembled
/// from its files) and `shard` left unsharded; under N > 1 ranks, this rank's share of the
/// output rows, `shard` saying which: a sharded checkpoint's own split under as many ranks as
/// saved it (each rank reads its own file), else equal shares (read from the files, or the
/// whole checkpoint, that hold them). A sharded checkpoint's Adam moments are not kept.
checkpoint_contents load_for_scoring(shard_comm& comm, const std::string& path,
                                     output_shard& shard);

/// Keeps rows [first, first + count) of `model`'s output layer (a whole model's, or a shard's
/// holding them), with their Adam moments when it has them; output_first = first.
void keep_output_rows(model_state& model, uint32_t first, uint32_t count);

}  // namespace hslide
