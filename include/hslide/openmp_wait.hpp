// How hslide's OpenMP threads wait at a barrier: a short spin, then sleep.
//
// Why: a training step is a dozen parallel loops, each ending in a barrier, and libgomp's
// default is to spin there for GOMP_SPINCOUNT = 300,000 `pause` instructions before sleeping.
// On CPUs whose `pause` takes ~140 cycles (Intel since Skylake-SP) that is ~20 ms of spinning:
// harmless on an idle machine, ruinous on a busy one, where the spinning thread holds a core
// that the thread it waits for needs. Measured on the 2-core Sapphire Rapids machine beside two
// compilers (Debian-recs, 2 threads, s an epoch): 4-15 with the default, 2.0-2.4 with
// OMP_WAIT_POLICY=passive (which sleeps at once, paying a futex wake a barrier), 0.8-1.0 with a
// spin count of 1,000 (bench/threads.md). On the idle machine the three are alike.
//
// libgomp reads its settings once, when it is loaded, before main(): the only way for a program
// to choose them is to set the variable and execute itself again, which is what
// settle_openmp_wait does. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is always kept.
#pragma once

namespace hslide {

/// The spin count hslide gives libgomp when the user set neither OMP_WAIT_POLICY nor
/// GOMP_SPINCOUNT: ~60 us of spinning on a CPU whose `pause` takes 140 cycles, past which a
/// thread sleeps.
inline constexpr const char* default_gomp_spin_count = "1000";

/// When the OpenMP runtime is libgomp and neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set
/// (nor HSLIDE_KEEP_OPENMP_WAIT=1), sets GOMP_SPINCOUNT to default_gomp_spin_count and replaces
/// the process with a fresh run of the same executable and arguments (/proc/self/exe); the
/// process keeps its id, so launchers (mpirun, timeout, a shell's job control) see nothing.
/// Returns (doing nothing) otherwise, or when the executable cannot be run again. Call it first
/// in main(), before any thread is started.
void settle_openmp_wait(char** argv);

/// The setting in force, for `hslide info`: "GOMP_SPINCOUNT=1000 (hslide's)", "OMP_WAIT_POLICY=
/// passive (yours)", or "the OpenMP runtime's default".
const char* openmp_wait_setting();

}  // namespace hslide
