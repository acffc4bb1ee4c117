// The table of `hslide train`'s options (see option_table.hpp): its help texts, the settings
// they fill, the choices from the enum name tables, and the unknown-option message.
#include "option_table.hpp"

#include "hslide/isa.hpp"
#include "hslide/lsh.hpp"
#include "hslide/validation.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <utility>

namespace hslide::cli {

void train_settings::apply_names() {
    train.adam = parse_adam_mode(adam);
    train.adam_moments = parse_moment_storage(adam_moments);
    train.schedule = parse_lr_schedule(lr_schedule);
    train.lr_scaling = parse_lr_batch_scaling(lr_scaling);
    train.loss = parse_output_loss(loss);
    trainer.eval.scoring = parse_scoring(scoring);
    parse_epochs(epochs, train);
    if (!keep_best.empty()) {
        trainer.validation.metric = parse_selection_metric(keep_best);
        trainer.validation.keep_best = true;
    }
}

const char* title(option_group group) {
    switch (group) {
        case option_group::essentials:
            return "Essentials";
        case option_group::data:
            return "Data: synthetic data, file formats, input scaling";
        case option_group::selection:
            return "Selection: the neurons a step computes (top-k, IVF)";
        case option_group::lsh:
            return "Selection by LSH";
        case option_group::optimiser:
            return "Optimiser: Adam and the learning rate";
        case option_group::hybrid:
            return "Hybrid (--backend hybrid)";
        case option_group::evaluation:
            return "Evaluation";
        case option_group::diagnostics:
            return "Diagnostics and output";
    }
    return "?";
}

namespace {

using group = option_group;
using check = option_check;
using spec = option_spec;

}  // namespace

std::string option_value_problem(const option_check& c, double value) {
    if (!std::isfinite(value)) return fmt::format("must be a finite number, not {}", value);
    switch (c.which) {
        case check::kind::none:
            return "";
        case check::kind::positive:
            return value > 0 ? "" : fmt::format("must be more than 0, not {:g}", value);
        case check::kind::non_negative:
            return value >= 0 ? "" : fmt::format("must be 0 or more, not {:g}", value);
        case check::kind::range:
            return value >= c.low && value <= c.high
                       ? ""
                       : fmt::format("must be from {:g} to {:g}, not {:g}", c.low, c.high, value);
    }
    return "";
}

namespace {

check positive() {
    return {check::kind::positive};
}
check non_negative() {
    return {check::kind::non_negative};
}
check range(double low, double high) {
    return {check::kind::range, low, high};
}
// Top-k is for the output layer only (validate(model_config)).
std::vector<std::string> without(std::vector<std::string> names, const std::string& name) {
    names.erase(std::remove(names.begin(), names.end(), name), names.end());
    return names;
}
std::vector<std::string> with_auto(std::vector<std::string> names) {
    names.insert(names.begin(), "auto");
    return names;
}

// The settings' addresses; one lambda per option keeps the table one declaration per line.
#define HSLIDE_FIELD(member) [](train_settings& s) -> option_target { return &s.member; }

std::vector<option_spec> make_table() {
    const option_surface cli = option_surface::cli, python = option_surface::python,
                         both = option_surface::both;
    std::vector<option_spec> t = {
        // --- essentials: data, model size, epochs, batch, learning rate, where, precision,
        // save/resume, validation, metrics
        spec("train", group::essentials, "training data file (XC or LibSVM); none: synthetic data",
             HSLIDE_FIELD(data.train), {}, {}, cli),
        spec("train-split", group::essentials,
             "XC split file selecting the training rows of --train", HSLIDE_FIELD(data.train_split),
             {}, {}, cli),
        spec("test", group::essentials,
             "test data file (default with --test-split: the --train file)",
             HSLIDE_FIELD(data.test), {}, {}, cli),
        spec("test-split", group::essentials, "XC split file selecting the test rows",
             HSLIDE_FIELD(data.test_split), {}, {}, cli),
        spec("hidden", group::essentials,
             "hidden layer sizes, e.g. 128 or 256,128 (given once); 0 = auto: 512 up to 1,024 "
             "output rows and 4,096 input features, else 256",
             HSLIDE_FIELD(model.hidden), {}, {}, both),
        spec("epochs", group::essentials,
             "auto: train until nDCG@5 (--keep-best) on a validation set (--valid..., else 5% of "
             "the training points, at most 2,000, held out by --seed) has not improved (by more "
             "than --min-gain) for --patience (1; 2 on a hold-out under 200 points) epochs, going "
             "back to the best epoch at a tenth of the learning rate --lr-drops times first (0 "
             "with a weight average, as on the cpu backends by default, else 1), at most 30 "
             "epochs, and keep the best epoch's model; or N: exactly N epochs on all the points "
             "(in total, when resuming)",
             HSLIDE_FIELD(epochs), {}, {}, both),
        spec("batch-size", group::essentials,
             "samples per step (0 = auto: 256 with --loss logistic on 8,192 training points or "
             "more, else 128; with --lr auto the rate then grows by the square-root rule)",
             HSLIDE_FIELD(train.batch_size), {}, non_negative(), both),
        // Range checked by validate(train_config), which names a non-finite value plainly.
        spec("lr", group::essentials,
             "Adam learning rate (0 = auto: 0.005 with --loss logistic, 0.003 with softmax; times "
             "sqrt(batch / 128) where --batch-size is auto)",
             HSLIDE_FIELD(train.learning_rate), {}, {}, both),
        // --backend's choices and footer come from the backend registry (restrict_backends).
        spec("backend", group::essentials, "where to compute", HSLIDE_FIELD(backend), {}, {}, both),
        spec("threads", group::essentials, "CPU threads (0 = all)", HSLIDE_FIELD(train.threads), {},
             non_negative(), both),
        spec("gpu", group::essentials,
             "GPU index for --backend gpu/gpu-dense and hybrid gpu workers (a GPU rank under "
             "mpirun: this plus its local rank, modulo the GPUs it sees)",
             HSLIDE_FIELD(compute.gpu), {}, non_negative(), both),
        spec("shard-weights", group::essentials,
             "under mpirun -np N (N > 1): each rank's share of the output layer's rows, e.g. 3,1, "
             "or auto: shares by each rank's measured scoring rate, within the memory each can "
             "spare (default: equal shares)",
             HSLIDE_FIELD(shard_weights), {}, {}, cli),
        spec("precision", group::essentials,
             "fp32, or bf16: bf16 weights and layer inputs in the products (fp32 master weights, "
             "gradients and Adam state)",
             HSLIDE_FIELD(compute.precision), names_of(precision_mode{}), {}, both),
        spec("seed", group::essentials, "seed of initialisation, shuffles and sampling",
             HSLIDE_FIELD(train.seed), {}, {}, both),
        spec("save", group::essentials,
             "write a checkpoint here after every epoch (atomically); with --keep-best it holds "
             "the best epoch's at the end; under --epochs auto it is always the best so far",
             HSLIDE_FIELD(trainer.save_path), {}, {}, cli),
        spec("resume", group::essentials,
             "resume from this checkpoint (its model replaces the model flags)",
             HSLIDE_FIELD(resume), {}, {}, cli),
        spec(
            "valid", group::essentials,
            "validation data file, evaluated after every epoch (for --epochs auto, --keep-best and "
            "--patience)",
            HSLIDE_FIELD(valid), {}, {}, cli),
        spec("valid-split", group::essentials,
             "XC split file selecting the validation rows of --train", HSLIDE_FIELD(valid_split),
             {}, {}, cli),
        spec("valid-fraction", group::essentials,
             "hold out this fraction of the training points (drawn with --seed) for validation",
             HSLIDE_FIELD(valid_fraction), {}, range(0.0, 1.0), both),
        spec("keep-best", group::essentials,
             "end with the model of the epoch best on the validation set by this metric: p@1, p@3, "
             "p@5, ndcg@k or psp@k (k = 1..5)",
             HSLIDE_FIELD(keep_best), {}, {}, both),
        spec("patience", group::essentials,
             "stop after this many epochs without improvement on the validation set (by "
             "--keep-best's metric, else p@1; 0 = never, or under --epochs auto its default: 1, or "
             "2 on a hold-out under 200 points)",
             HSLIDE_FIELD(trainer.validation.patience), {}, {}, both),
        spec("lr-drops", group::essentials,
             "at a plateau (patience run out) go back to the best epoch's model and go on at a "
             "tenth of the learning rate, this many times, before stopping (needs --keep-best "
             "and --patience; -1 = under --epochs auto its default: 0 with a weight average "
             "(--ema), else 1; 0 without --epochs auto)",
             HSLIDE_FIELD(trainer.validation.lr_drops), {}, range(-1, 16), both),
        spec("epochs-per-drop", group::essentials,
             "after a --lr-drops drop, train at most this many epochs at the lower rate before "
             "the next drop or the stop (0 = until the next plateau; -1 = under --epochs auto "
             "its default, 1, else 0)",
             HSLIDE_FIELD(trainer.validation.epochs_per_drop), {}, range(-1, 1000), both),
        spec("min-gain", group::essentials,
             "an epoch counts as improving (for --patience) only when it beats the last that "
             "did by more than this many standard errors of the validation metric, "
             "sqrt(m (1 - m) / points) (0 = any gain; -1 = under --epochs auto its default, "
             "0.5, on a validation set of 200 points or more, else 0)",
             HSLIDE_FIELD(trainer.validation.min_gain), {}, range(-1.0, 100.0), both),
        spec("metrics-out", group::essentials,
             "append one JSON record per epoch to this JSONL file",
             HSLIDE_FIELD(trainer.metrics_out), {}, {}, cli),
        // --- data
        spec("preset", group::data, "synthetic preset when no --train is given",
             HSLIDE_FIELD(data.preset), {}, {}, cli),
        spec("scale", group::data, "synthetic: multiplies the preset's point counts",
             HSLIDE_FIELD(data.scale), {}, positive(), cli),
        spec("labels", group::data, "synthetic: number of labels (0 = the preset's)",
             HSLIDE_FIELD(data.labels), {}, {}, cli),
        spec("features", group::data, "synthetic: number of features (0 = the preset's)",
             HSLIDE_FIELD(data.features), {}, {}, cli),
        spec("data-seed", group::data, "synthetic: generator seed", HSLIDE_FIELD(data.data_seed),
             {}, {}, cli),
        spec("split-column", group::data, "which column (1-based) of the split files",
             HSLIDE_FIELD(data.split_column), {}, positive(), cli),
        spec("format", group::data, "input format", HSLIDE_FIELD(data.format),
             {"auto", "xc", "libsvm"}, {}, cli),
        spec("no-cache", group::data, "do not read or write the binary cache of parsed files",
             HSLIDE_FIELD(data.no_cache), {}, {}, cli),
        spec("verify-cache", group::data,
             "use a cache only if a checksum of every byte of the file matches (by default a "
             "file over 16 MiB is checked by size, modification time and 256 sampled blocks)",
             HSLIDE_FIELD(data.verify_cache), {}, {}, cli),
        spec("normalize", group::data, "input scaling per point: l2 (unit norm) or none",
             HSLIDE_FIELD(model.normalize), names_of(input_normalization{}), {}, both),
        spec("label-rows", group::data,
             "which labels the output layer has rows for: carried (those a training point "
             "carries; the others can never be learned, and their rows cost memory and time), "
             "all (every label id of the data) or auto (carried where most label ids are carried "
             "by no training point)",
             HSLIDE_FIELD(model.label_rows), {"auto", "carried", "all"}, {}, both),
        // --- selection
        spec("output-sparsity", group::selection,
             "output layer: topk (each sample's labels, its --top-k highest logits, found as "
             "--top-k-search says, and random neurons up to --min-active), lsh (SLIDE's hash "
             "tables), dense, or auto (topk with sets sized from the layer, dense where a set "
             "would hold every row: what it chose is on the model line)",
             HSLIDE_FIELD(model.output_sparsity), names_of(sparsity_mode{}), {}, both),
        spec("top-k", group::selection,
             "top-k output layers: output neurons a training sample keeps besides its labels "
             "(0 = auto: a quarter of the set, 16 to 64)",
             HSLIDE_FIELD(model.top_k), {}, {}, both),
        spec("top-k-search", group::selection,
             "top-k output layers: how the top-k is found: exact (every output row scored; the "
             "full-softmax loss), ivf (an inverted-file index: the rows clustered, a sample scores "
             "the rows of its --ivf-probes best clusters; CPU only, the loss over the set as "
             "LSH's) or auto (ivf on the CPU, exact on the GPU)",
             HSLIDE_FIELD(model.top_k_search), names_of(top_k_search{}), {}, both),
        spec("reuse-candidates", group::selection,
             "a top-k output layer searched exactly on the cpu backend reuses a training point's "
             "candidates while its last search is younger than this many epochs (0 = search "
             "every step; -1 = auto: 1 on cpu in one process where the output layer has 4,096 rows "
             "or more, else 0; the first epoch's searches are not kept)",
             HSLIDE_FIELD(train.reuse_candidates_epochs), {}, range(-1.0, 1000.0), both),
        spec("ivf-min-recall", group::selection,
             "an automatic IVF search (--top-k-search auto on the cpu backend) gives way to the "
             "exact search once the selection probe (after each epoch; within the first at "
             "steps 64, 128, 256, ...) finds less than this share of the exact top in its sets "
             "(0 = never)",
             HSLIDE_FIELD(train.ivf_min_recall), {}, range(0.0, 1.0), both),
        spec("ivf-clusters", group::selection,
             "--top-k-search ivf: clusters of output rows (0: about sqrt(rows) / 2)",
             HSLIDE_FIELD(model.ivf_clusters), {}, {}, both),
        spec("ivf-probes", group::selection,
             "--top-k-search ivf: clusters whose rows a sample's search scores",
             HSLIDE_FIELD(model.ivf_probes), {}, positive(), both),
        spec("ivf-refresh", group::selection,
             "--top-k-search ivf: training steps between refreshes of the index (every 4th: rows "
             "reassigned, centroids recomputed; the others: the rows changed since reassigned; 0: "
             "only its rebuilds, on --rebuild's schedule)",
             HSLIDE_FIELD(model.ivf_refresh), {}, {}, both),
        spec("fill-correction", group::selection,
             "top-k output layers: weight (0..1) of the log-Q correction on the random fill: 1 "
             "lets each random neuron stand for the rows outside the set it was drawn from (needed "
             "where labels are rare, e.g. Amazon-3M), 0 is the plain set softmax",
             HSLIDE_FIELD(model.fill_correction), {}, range(0.0, 1.0), both),
        spec("fill-pool", group::selection,
             "top-k output layers: each step's random fill is drawn from one pool of this many "
             "rows (0..1) per neuron of the step's sets (x batch x --min-active, at least 4 x "
             "--min-active; none where a step would touch at most a fifth of the layer): fewer "
             "rows touched and updated a step; 0 = the whole layer",
             HSLIDE_FIELD(model.fill_pool), {}, range(0.0, 1.0), both),
        spec("min-active", group::selection,
             "random fill of an active set (top-k or LSH) up to this many neurons (one, or one per "
             "layer after the first; 0 = auto: a top-k layer's sets about 1.6 sqrt(rows), a power "
             "of two from 32 to 1024, at most what lets a step of --batch-size touch half the "
             "rows; an LSH layer's 1024)",
             HSLIDE_FIELD(model.min_active), {}, {}, both),
        spec("hidden-sparsity", group::selection,
             "hidden layers after the first: auto, lsh or dense",
             HSLIDE_FIELD(model.hidden_sparsity), without(names_of(sparsity_mode{}), "topk"), {},
             both),
        spec("auto-sparse-min", group::selection,
             "'auto' hidden layers with more neurons than this are LSH-sparse (an auto output "
             "layer is planned from its size: see --output-sparsity)",
             HSLIDE_FIELD(model.auto_sparse_min), {}, {}, both),
        spec("rebuild", group::selection,
             "samples between refreshes of the sparse layers' selections (LSH tables, IVF index), "
             "initially",
             HSLIDE_FIELD(train.rebuild_every), {}, positive(), both),
        spec("rebuild-decay", group::selection,
             "the rebuild period grows by exp(this) after each rebuild",
             HSLIDE_FIELD(train.rebuild_decay), {}, {}, both),
        // --- LSH: one value, or one per layer after the first
        spec("hash", group::lsh, "LSH family (one, or one per layer after the first)",
             HSLIDE_FIELD(model.hash), names_of(hash_kind{}), {}, both),
        spec("K", group::lsh, "hashes per bucket code", HSLIDE_FIELD(model.K), {}, range(1, 32),
             both),
        spec("L", group::lsh, "hash tables", HSLIDE_FIELD(model.L), {}, range(1, lsh_max_tables),
             both),
        spec("bits", group::lsh, "bits per hash (DWTA/WTA bins hold 2^bits coordinates)",
             HSLIDE_FIELD(model.bits), {}, range(1, 16), both),
        spec("bucket-capacity", group::lsh, "neurons kept per bucket",
             HSLIDE_FIELD(model.bucket_capacity), {}, positive(), both),
        spec("insertion", group::lsh, "policy of a full bucket", HSLIDE_FIELD(model.insertion),
             names_of(insertion_policy{}), {}, both),
        spec("max-active", group::lsh, "cap of an active set (0 = none; labels always kept)",
             HSLIDE_FIELD(model.max_active), {}, {}, both),
        spec("hit-threshold", group::lsh, "keep neurons found in at least this many tables",
             HSLIDE_FIELD(model.hit_threshold), {}, positive(), both),
        spec("probes", group::lsh,
             "LSH queries at prediction: each table also looks in this many nearby buckets "
             "(multi-probe; DWTA and WTA; more recall for more time; training never probes)",
             HSLIDE_FIELD(model.probes), {}, range(0, 64), both),
        spec("rehash", group::lsh, "samples between new hash functions (0 = never)",
             HSLIDE_FIELD(train.rehash_every), {}, {}, both),
        spec("gpu-async-rebuild", group::lsh,
             "GPU: rebuild the LSH tables on a side stream while training goes on with the old "
             "ones, swapped in when done (default: the next step waits for them)",
             HSLIDE_FIELD(compute.gpu_async_rebuild), {}, {}, both),
        // --- optimiser
        spec("adam", group::optimiser,
             "sparse: update only touched rows; dense: every row every step (SLIDE); input-dense: "
             "every input-layer row, the touched rows of the others; catch-up: dense's result at "
             "sparse cost (CPU backends); input-catch-up: input-dense's result at sparse cost",
             HSLIDE_FIELD(adam), names_of(adam_mode{}), {}, both),
        spec("adam-moments", group::optimiser,
             "Adam's moments of the layers past the input one: fp32, or bf16 rounded "
             "stochastically (half their memory, 30% less update traffic; cpu backend)",
             HSLIDE_FIELD(adam_moments), names_of(moment_storage{}), {}, both),
        spec("output-lr-scale", group::optimiser,
             "the output layer's learning rate as a multiple of --lr (with its schedule and "
             "drops; the hidden layers train at --lr); 0 = auto: 1 up to 12288 output rows, "
             "12288 / rows above",
             HSLIDE_FIELD(model.output_lr_scale), {}, non_negative(), both),
        spec("loss", group::optimiser,
             "the output layer's loss: softmax (the cross-entropy of the set's softmax, the "
             "labels sharing the target), logistic (a binary cross-entropy per neuron of the "
             "set, biases starting at the labels' prior: it ranks by each label's own "
             "probability, what P@k counts; P@1 +0.016 on a set of 4.7 labels a point, "
             "bench/peers.md; every backend), or auto (logistic on the cpu and cpu-dense "
             "backends and cpu ranks, softmax on the GPU backends and the hybrid until a GPU run "
             "has compared the two)",
             HSLIDE_FIELD(loss), names_of(output_loss{}), {}, both),
        spec("beta1", group::optimiser, "Adam beta1", HSLIDE_FIELD(train.adam_beta1), {}, {}, both),
        spec("beta2", group::optimiser, "Adam beta2", HSLIDE_FIELD(train.adam_beta2), {}, {}, both),
        spec("adam-eps", group::optimiser, "Adam epsilon", HSLIDE_FIELD(train.adam_epsilon), {}, {},
             both),
        spec("lr-schedule", group::optimiser,
             "constant, or linear: decay to 0 over the run (from --lr at the start)",
             HSLIDE_FIELD(lr_schedule), names_of(hslide::lr_schedule{}), {}, both),
        spec("lr-scaling", group::optimiser,
             "large-batch rule: none, sqrt (--lr x sqrt(batch / --lr-base-batch), for Adam) or "
             "linear (x batch / --lr-base-batch)",
             HSLIDE_FIELD(lr_scaling), names_of(lr_batch_scaling{}), {}, both),
        spec("lr-base-batch", group::optimiser, "the batch size --lr is tuned for (--lr-scaling)",
             HSLIDE_FIELD(train.lr_base_batch), {}, positive(), both),
        spec("warmup", group::optimiser,
             "samples over which the learning rate ramps up from 0 at the start (0 = none)",
             HSLIDE_FIELD(train.warmup_samples), {}, {}, both),
        spec("ema", group::optimiser,
             "evaluate, keep and save an exponential moving average of the weights with this "
             "time constant in epochs, updated 4 times an epoch (0 = the weights themselves; -1 "
             "= auto: 0.5 on the cpu and cpu-dense backends, else 0; elsewhere each update exports "
             "the model)",
             HSLIDE_FIELD(train.ema_epochs), {}, range(-1.0, 1000.0), both),
        // --- hybrid
        spec("schedule", group::hybrid,
             "hybrid: hogbatch (fixed --worker-batch sizes) or adaptive (sizes from measured "
             "throughput, to meet --update-share)",
             HSLIDE_FIELD(hybrid.policy), names_of(schedule_policy{}), {}, cli),
        // --workers' kinds come from the backend registry (add_hybrid_worker_help).
        spec("workers", group::hybrid, "hybrid: the workers, e.g. cpu,gpu or cpu,cpu",
             HSLIDE_FIELD(hybrid.workers), {}, {}, cli),
        spec("worker-threads", group::hybrid,
             "hybrid: CPU threads per CPU worker (one value, or one per worker; 0 = the cores left "
             "after the other workers' explicit counts and one core per GPU worker, shared evenly)",
             HSLIDE_FIELD(hybrid.threads), {}, {}, cli),
        spec("worker-batch", group::hybrid,
             "hybrid: batch size per worker (hogbatch: fixed; adaptive: the start); auto: "
             "--batch-size for a CPU worker (a quarter of it beside a GPU worker, the Hogbatch "
             "split), 8 x --batch-size for a GPU worker",
             HSLIDE_FIELD(hybrid.batch), {}, {}, cli),
        spec("update-share", group::hybrid,
             "hybrid, adaptive: relative share of model updates per worker",
             HSLIDE_FIELD(hybrid.share), {}, {}, cli),
        spec("worker-output-sparsity", group::hybrid,
             "hybrid: each worker's choice of output neurons, e.g. topk,lsh (model: the model's "
             "--output-sparsity; one value, or one per worker)",
             HSLIDE_FIELD(hybrid.output_sparsity), {}, {}, cli),
        spec("merge-every", group::hybrid,
             "hybrid: samples a worker trains between merges into the shared model (0 = automatic: "
             "after training twice as long as its last merge took; 1 = after every batch)",
             HSLIDE_FIELD(hybrid.merge_every), {}, {}, cli),
        spec("first-layer-merge-every", group::hybrid,
             "hybrid: the first layer's rows take part in every N-th merge of a worker (and in "
             "those before evaluations, checkpoints and parking); they wait in the replica "
             "meanwhile, never dropped (1 = every merge)",
             HSLIDE_FIELD(hybrid.first_layer_merge_every), {}, positive(), cli),
        spec("merge-threads", group::hybrid,
             "hybrid: threads of a worker's merge passes (0 = a CPU worker's own threads, 1 for a "
             "GPU worker); merges before evaluations and checkpoints use every worker's",
             HSLIDE_FIELD(hybrid.merge_threads), {}, non_negative(), cli),
        spec("min-batch", group::hybrid, "hybrid, adaptive: smallest batch size",
             HSLIDE_FIELD(hybrid.min_batch), {}, positive(), cli),
        spec("max-batch", group::hybrid, "hybrid, adaptive: largest batch size",
             HSLIDE_FIELD(hybrid.max_batch), {}, positive(), cli),
        spec("park-below-share", group::hybrid,
             "hybrid, adaptive: while the slowest worker trains less than this share of the "
             "samples, measure whether the others are as fast without it, and if so park it (no "
             "batches) for a while (0 = never)",
             HSLIDE_FIELD(hybrid.park_below_share), {}, range(0.0, 1.0), cli),
        // --- evaluation
        spec("eval-every", group::evaluation,
             "evaluate the test set every N epochs (0 = only at the end: the kept model's, the "
             "default under --epochs auto; else 1)",
             HSLIDE_FIELD(trainer.eval_every), {}, {}, cli),
        spec("scoring", group::evaluation,
             "evaluation scoring: exact (every label), exact-bf16 (every label, the products in "
             "bf16 where the CPU has bf16 products, else exact), exact-fast (every label ranked "
             "in int8 where the CPU's exact search is, its best re-scored in fp32, else as "
             "exact-bf16: what --epochs auto scores its hold-out with when this is exact), lsh "
             "(the LSH active set only), ivf (a top-k "
             "layer's IVF index: the rows of the --ivf-probes best clusters; CPU), or auto (the "
             "output layer's own index: lsh for LSH layers, ivf for top-k layers searched by IVF, "
             "else exact)",
             HSLIDE_FIELD(scoring), names_of(scoring_mode{}), {}, both),
        spec("eval-max", group::evaluation, "evaluate on at most this many test points (0 = all)",
             HSLIDE_FIELD(trainer.eval.max_points), {}, {}, both),
        spec("propensity-a", group::evaluation, "PSP@k propensity A",
             HSLIDE_FIELD(trainer.eval.metrics.propensity_a), {}, {}, both),
        spec("propensity-b", group::evaluation, "PSP@k propensity B",
             HSLIDE_FIELD(trainer.eval.metrics.propensity_b), {}, {}, both),
        // --- diagnostics and output
        spec("selection-probe", group::diagnostics,
             "after each evaluated epoch, score this many training points exactly and report how "
             "well the output layer's active sets (labels not forced) hold their top "
             "--selection-top logits and their labels (0 = never; -1 = auto: 256 where the "
             "selection is approximate, LSH or an IVF index, none where it is exact)",
             HSLIDE_FIELD(trainer.selection_probe_points), {}, range(-1, 1 << 30), both),
        spec("selection-top", group::diagnostics,
             "the exact top logits the selection probe's recall is against",
             HSLIDE_FIELD(trainer.selection_probe_top), {}, positive(), both),
        spec("isa", group::diagnostics,
             "CPU kernel level: auto (the best this CPU has, or $HSLIDE_ISA), scalar, avx2, "
             "avx512, avx512bf16, amx (avx512bf16 with AMX tiles for exact scoring)",
             HSLIDE_FIELD(compute.isa), with_auto(names_of(isa_level{})), {}, both),
        spec("quiet", group::diagnostics, "only warnings and errors on stderr",
             HSLIDE_FIELD(output.quiet), {}, {}, cli, "-q"),
        spec("no-progress", group::diagnostics, "no progress bars or progress lines",
             HSLIDE_FIELD(output.no_progress), {}, {}, cli),
        spec("progress", group::diagnostics, "progress bars while training and evaluating",
             HSLIDE_FIELD(progress), {}, {}, python),
        spec("log-level", group::diagnostics, "trace, debug, info, warn, error",
             HSLIDE_FIELD(output.log_level), {"trace", "debug", "info", "warn", "error"}, {}, both),
    };
    // --help prints the groups in the order their first options are registered.
    std::stable_sort(t.begin(), t.end(), [](const option_spec& a, const option_spec& b) {
        return int(a.group) < int(b.group);
    });
    return t;
}

#undef HSLIDE_FIELD

/// Edit distance (insertions, deletions, substitutions), case-insensitive.
size_t distance(const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t above = row[j];
            const bool same = std::tolower(a[i - 1]) == std::tolower(b[j - 1]);
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
            diagonal = above;
        }
    }
    return row[b.size()];
}

std::string spelled(std::string name, char separator) {
    std::replace(name.begin(), name.end(), '-', separator);
    return name;
}

}  // namespace

const std::vector<option_spec>& train_option_table() {
    static const std::vector<option_spec> table = make_table();
    return table;
}

const option_spec* find_option(const std::string& name) {
    for (const option_spec& o : train_option_table())
        if (o.name == name) return &o;
    return nullptr;
}

std::string unknown_option_message(const std::string& name, option_surface surface,
                                   char separator) {
    const std::string flag = spelled(name, '-');
    // The nearest names within a third of the name's length (at least 1, at most 3 edits),
    // and those the name starts or is part of.
    std::vector<std::pair<size_t, std::string>> near;
    const size_t limit = std::clamp<size_t>(flag.size() / 3, 1, 3);
    for (const option_spec& o : train_option_table()) {
        if (o.surface != option_surface::both && o.surface != surface) continue;
        const size_t d = distance(flag, o.name);
        const bool part = flag.size() >= 3 && (o.name.find(flag) != std::string::npos ||
                                               flag.find(o.name) != std::string::npos);
        if (d <= limit || part) near.emplace_back(part ? std::min(d, limit) : d, o.name);
    }
    std::stable_sort(near.begin(), near.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    if (near.size() > 3) near.resize(3);
    std::string message = fmt::format("unknown option '{}'", spelled(name, separator));
    for (size_t i = 0; i < near.size(); ++i)
        message += fmt::format("{}'{}'",
                               i == 0                 ? " (did you mean "
                               : i + 1 == near.size() ? " or "
                                                      : ", ",
                               spelled(near[i].second, separator));
    return message + (near.empty() ? "" : "?)");
}

}  // namespace hslide::cli
