// `hslide gen` (synthetic XC files) and `hslide info` (what this machine and build offer).
#include "cli_common.hpp"

#include "hslide/error.hpp"
#include "hslide/gpu_devices.hpp"
#include "hslide/isa.hpp"
#include "hslide/openmp_wait.hpp"
#include "hslide/progress.hpp"
#include "hslide/synthetic.hpp"
#include "hslide/system_info.hpp"

#include <spdlog/spdlog.h>

#include <omp.h>

#include <chrono>
#include <cstdio>

namespace hslide::cli {

int run_gen(int argc, char** argv) {
    CLI::App app{
        "Write a synthetic multi-label dataset as DIR/train.txt and DIR/test.txt (XC format).",
        "hslide gen"};
    add_config_option(app);
    synthetic_config sc;
    std::string out_dir;
    int threads = 0;
    app.add_option("--preset", sc.preset,
                   "amazon670k, delicious200k, wikilshtc325k, amazon3m or tiny")
        ->capture_default_str();
    app.add_option("--scale", sc.scale, "multiplies the preset's point counts")
        ->check(number_of_type<decltype(sc.scale)>())
        ->check(meets({option_check::kind::positive}))
        ->capture_default_str();
    app.add_option("--labels", sc.n_labels, "number of labels (0 = the preset's)")
        ->check(number_of_type<decltype(sc.n_labels)>());
    app.add_option("--features", sc.n_features, "number of features (0 = the preset's)")
        ->check(number_of_type<decltype(sc.n_features)>());
    app.add_option("--seed", sc.seed, "generator seed")
        ->check(number_of_type<decltype(sc.seed)>())
        ->capture_default_str();
    app.add_option("--out", out_dir, "output folder")->required()->check(not_empty());
    app.add_option("--threads", threads, "threads (0 = all)")
        ->check(number_of_type<int>())
        ->check(meets({option_check::kind::non_negative}));
    train_settings settings;
    add_table_options(app, settings, {"quiet", "no-progress", "log-level"});
    if (const auto exit_code = parse_command_line(app, argc, argv)) return *exit_code;
    const bool show_progress = apply_output_options(settings.output);
    if (check_thread_count(threads, "--threads") > 0) omp_set_num_threads(threads);
    const auto t0 = std::chrono::steady_clock::now();
    generate_synthetic_files(sc, out_dir, show_progress);
    spdlog::info("wrote {}/train.txt and {}/test.txt ({:.1f} s)", out_dir, out_dir,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return 0;
}

int run_info(int argc, char** argv) {
    CLI::App app{"Show the CPU, SIMD levels, threads and GPUs this build can use.", "hslide info"};
    if (const auto exit_code = parse_command_line(app, argc, argv)) return *exit_code;
    const system_info si = read_system_info();
    std::printf("%s\n", describe(si).c_str());
    const isa_level active = active_isa();
    std::printf("cpu kernels: %s (best on this cpu: %s; --isa or HSLIDE_ISA picks another)\n",
                to_string(active), to_string(detected_isa()));
    std::printf("openmp threads wait: %s\n", openmp_wait_setting());
    std::printf("cuda backend in this build: %s\n", cuda_build() ? "yes" : "no");
    std::string problem;
    const auto gpus = list_gpus(&problem);
    if (cuda_build()) std::printf("cuda: %s\n", cuda_versions().c_str());
    if (gpus.empty()) std::printf("gpus: none (%s)\n", problem.c_str());
    for (const auto& g : gpus)
        std::printf("gpu %d: %s, compute %d.%d, %s total, %s free\n", g.index, g.name.c_str(),
                    g.compute_major, g.compute_minor, human_bytes(double(g.total_memory)).c_str(),
                    human_bytes(double(g.free_memory)).c_str());
    return 0;
}

}  // namespace hslide::cli
