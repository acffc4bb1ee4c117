// The `hslide` command: dispatches to train | eval | predict | gen | info (and --version).
// Each subcommand is its own CLI11 app, so its --config file can mirror its flags with flat
// keys.
#include "cli_common.hpp"
#include "hslide/error.hpp"
#include "hslide/memory.hpp"
#include "hslide/openmp_wait.hpp"
#include "hslide/progress.hpp"
#include "hslide/shard_comm.hpp"
#include "hslide/system_info.hpp"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

namespace {

const char* usage =
    "hslide: sub-linear (LSH-sparse) training of wide networks on CPU and GPU\n"
    "\n"
    "usage: hslide <command> [options]   (hslide <command> --help for its options)\n"
    "       hslide --version\n"
    "\n"
    "commands:\n"
    "  train     train a model (on the built-in synthetic data when no --train is given)\n"
    "  eval      evaluate a saved model on a test set (P@k, nDCG@k, PSP@k)\n"
    "  predict   write the top-k labels of every point of a data file\n"
    "  gen       write a synthetic dataset (train.txt, test.txt) in XC format\n"
    "  info      show the CPU, SIMD levels, threads and GPUs this build can use\n";

/// Ends the command after an error: prints it (with the rank in a run of several MPI ranks,
/// whose other ranks would otherwise wait in a collective for ever) and returns the exit code,
/// or, in a run of several ranks, ends every rank of the job with it (MPI_Abort).
int fail(const std::string& command, int exit_code, const char* message) {
    if (hslide::shard_comm* comm = hslide::started_multi_rank_comm()) {
        std::fprintf(stderr, "hslide %s: error on rank %d of %d: %s\n", command.c_str(),
                     comm->rank(), comm->size(), message);
        comm->abort(exit_code);
    }
    std::fprintf(stderr, "hslide %s: error: %s\n", command.c_str(), message);
    return exit_code;
}

/// The command's exit code, after MPI's end in a run of several ranks.
int finish(int exit_code) {
    hslide::finish_world_comm();
    return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
    hslide::settle_openmp_wait(argv);  // may run this executable again, with GOMP_SPINCOUNT set
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
        std::fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const std::string command = argv[1];
    if (command == "--version" || command == "-V") {
        // What a bug report needs; `hslide info` has the machine.
        std::printf("hslide %s (CUDA backend: %s; compiler: %s)\n", HSLIDE_VERSION,
                    HSLIDE_HAVE_CUDA ? "built" : "not built",
                    hslide::read_system_info().compiler.c_str());
        return 0;
    }
    try {
        using namespace hslide::cli;
        if (command == "train") return finish(run_train(argc - 1, argv + 1));
        if (command == "eval") return finish(run_eval(argc - 1, argv + 1));
        if (command == "predict") return finish(run_predict(argc - 1, argv + 1));
        if (command == "gen") return run_gen(argc - 1, argv + 1);
        if (command == "info") return run_info(argc - 1, argv + 1);
        std::fprintf(stderr, "hslide: unknown command '%s'\n\n%s", command.c_str(), usage);
        return 2;
    } catch (const hslide::error& e) {
        return fail(command, e.exit_code(), e.what());
    } catch (const std::bad_alloc&) {
        // Sized allocations say what they were (hslide/memory.hpp); this is any other one.
        const std::string message = "out of memory (an allocation failed; " +
                                    hslide::human_bytes(double(hslide::available_host_bytes())) +
                                    " available)";
        return fail(command, 1, message.c_str());
    } catch (const std::exception& e) {
        return fail(command, 1, e.what());
    }
}
