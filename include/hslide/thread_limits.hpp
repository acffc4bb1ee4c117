// How many CPU threads hslide may be asked for: one check for every entry point (the CLI's
// --threads and --worker-threads/--merge-threads, a --config file's threads, the Python
// module's threads option), made before any OpenMP team is started.
//
// Why: libgomp starts the threads it is asked for without checking, and a request the machine
// cannot satisfy (100,000 threads of 8 MiB stacks) dies with SIGSEGV inside the runtime rather
// than with an error. The limit is 8 threads per logical CPU (or 64, where there are fewer than
// 8 CPUs): past that, threads only take turns on the cores. OMP_THREAD_LIMIT is the runtime's
// own: it caps every team to it without failing, so a request above it is not refused here.
#pragma once

#include <string>

namespace hslide {

/// The largest thread count check_thread_count accepts on this machine.
int max_thread_count();

/// Returns `threads` as an int, or throws hslide::error (invalid_argument) when it is negative,
/// not a whole number, or above max_thread_count(); the message names `what` (e.g.
/// "--threads"), the value, the limit and where the limit comes from. 0 (= all of the
/// machine's threads) is accepted when the OpenMP default (OMP_NUM_THREADS) is within the
/// per-CPU cap. A double so that any parsed number is checked before it is narrowed.
int check_thread_count(double threads, const std::string& what);

}  // namespace hslide
