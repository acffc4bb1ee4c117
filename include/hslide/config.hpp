// The network and training configuration: every knob `hslide train` has, as plain structs.
//
// The CLI fills these from flags and from a config file (which mirrors every flag); the
// backends and the trainer only read them. `validate` rejects what cannot work, with a
// message that names the setting.
#pragma once

#include "hslide/isa.hpp"
#include "hslide/loss.hpp"
#include "hslide/lsh.hpp"
#include "hslide/thread_limits.hpp"  // validate(train_config) checks threads with it

#include <cstdint>
#include <string>
#include <vector>

namespace hslide {

/// Whether a layer computes all its neurons or only an active set, and how it chooses it (the
/// setting; model_config::selection says what it resolves to for a layer).
enum class sparsity_mode {
    /// sparse when the layer has more than `auto_sparse_min` neurons (top-k for the output
    /// layer, LSH for a hidden one: model_config::selection), else dense
    automatic,
    lsh,    ///< always LSH-sparse
    dense,  ///< always every neuron
    /// top-k: the sample's labels plus the `top_k` highest logits, found as
    /// layer_config::search says (the output layer only)
    topk,
};
sparsity_mode parse_sparsity(const std::string& name);
const char* to_string(sparsity_mode mode);

/// How each input point's feature values are scaled before the first layer.
enum class input_normalization {
    none,  ///< values as given
    l2,    ///< each point scaled to unit L2 norm (the usual XC practice; the default)
};
input_normalization parse_input_normalization(const std::string& name);
const char* to_string(input_normalization mode);

/// How a layer's active neurons are chosen for a sample: the one seam every backend's forward
/// pass goes through. Whatever the strategy, a training sample's active set lists its labels
/// first, and forward, softmax, backward and Adam touch only the set's rows.
enum class neuron_selection {
    all,  ///< every neuron (a dense layer)
    /// the union of the sample's LSH buckets (SLIDE), random fill up to min_active; the softmax
    /// is normalised over the set
    lsh,
    /// the `top_k` neurons with the highest logits, found as layer_config::search says (exact:
    /// every row scored, a GEMM over the batch; ivf: an inverted-file index), plus the labels,
    /// then random fill up to active.min_active (layer_config::fill_correction weighs it); the
    /// gradient is the softmax over the set (its hardest negatives). Searched exactly, the loss
    /// reported is the full-softmax cross-entropy (through the exact log-partition over every
    /// neuron) and the probability mass of the rows left out is reported (`dropped_mass`); by
    /// IVF, the loss is the set's, as LSH's
    top_k,
};
const char* to_string(neuron_selection selection);

/// How top-k selection finds a sample's `top_k` highest logits.
enum class top_k_search {
    /// every output row scored (a GEMM over the batch): the true top-k, and the full softmax's
    /// log-partition, so the loss reported is the full cross-entropy and dropped_mass is measured
    exact,
    /// an inverted-file index (FAISS's IndexIVFFlat): the rows clustered by inner product, a
    /// sample scores the centroids, then the rows of its `ivf_probes` best clusters only. The
    /// result is approximate (the selection probe measures its recall); the loss reported is
    /// the set's, as LSH's, and dropped_mass is not measured
    ivf,
    /// the backend's best: exact on the GPU (where scoring every row is a GEMM); on the CPU
    /// whichever scores fewer rows at the CPU's rates (cpu_top_k_search): ivf on large layers
    /// (exact scoring in fp32 is most of a CPU step there; IVF keeps its P@1 at a third of its
    /// time, bench/topk.md), exact where the index would probe a large share of its clusters
    automatic,
};
top_k_search parse_top_k_search(const std::string& name);
const char* to_string(top_k_search search);

/// One fully connected layer: `size` neurons over the previous layer's output.
struct layer_config {
    uint32_t size = 0;
    sparsity_mode sparsity = sparsity_mode::dense;
    lsh_config lsh;  ///< used when the layer selects with LSH
    /// LSH layers: all of it (the fill, the cap, the hit threshold, the probes); top-k layers:
    /// min_active, the size their random fill tops a set up to
    active_set_config active;
    uint32_t top_k = 64;  ///< neurons a sample keeps besides its labels (top-k selection)
    /// How top-k selection finds them (the library's default: exact; hslide train's and the
    /// Python module's: automatic).
    top_k_search search = top_k_search::exact;
    /// --top-k-search ivf: the index's clusters (0 = about sqrt(rows) / 2) and the clusters a
    /// sample's search scores the rows of (bench/topk.md: about 400 and 48 at 670k rows keep
    /// exact top-k's P@1)
    uint32_t ivf_clusters = 0;
    uint32_t ivf_probes = 48;
    /// --top-k-search ivf: training steps between refreshes of the index (every 4th its rows
    /// reassigned and its centroids recomputed, the others the rows changed since the last
    /// reassigned; 0: none), besides its rebuilds with the LSH tables' schedule
    /// (bench/topk.md: every 2 steps keeps the first epoch's P@1, every 4 loses 0.02 of it;
    /// bench/peers.md: under --epochs auto, with its drop of the rate, every 4 ends within 0.001
    /// of every 2 on the Amazon-670K shape, seeds 1 and 2, in 9-12% less time)
    uint32_t ivf_refresh = 4;
    /// Top-k: the weight (0..1) of the sampled softmax's log-Q correction on the random fill.
    /// The fill's r neurons are drawn from the M rows outside the labels and the top-k, so each
    /// stands for M / r of them; the gradient's softmax adds fill_correction * log(M / r) to
    /// their logits. 0: the plain set softmax (the top-k's hard negatives weigh as much as the
    /// small set lets them, which suppresses frequent labels); 1: the set's partition function
    /// estimates the full one (bench/topk.md).
    float fill_correction = 0.0f;
    /// Top-k: the size of each step's pool of random-fill candidates (fill_pool.hpp) in
    /// entries per neuron the step's sets hold: every sample of a step of b samples draws its
    /// fill from the same fill_pool * b * min_active rows (at least 4 * min_active), so the
    /// rows a step touches, and its Adam update, shrink while every row is still drawn about
    /// as often per epoch at any batch size; a step whose draws would touch at most a fifth of
    /// the rows has no pool. 0: no pool, the fill draws from the whole layer. (bench/topk.md:
    /// at 670k labels and batch 256, 0.5 touches 16% of the rows a step instead of 31%, with
    /// the whole layer's P@1 after epochs 2 and 3, within 0.002 with another seed after each.)
    float fill_pool = 0.5f;
    /// The layer's learning rate as a multiple of the step's (--lr with its schedule, scaling
    /// and drops): Adam moves this layer's weights and bias by lr_scale x lr. `hslide train
    /// --output-lr-scale` sets the output layer's; 1 elsewhere. (bench/peers.md: the
    /// Amazon-670K shape's top-k layer of 69,410 rows overfits at the hidden layers' rate.)
    float lr_scale = 1.0f;
};

/// The clusters of an IVF index over `rows` rows when layer_config::ivf_clusters is 0: about
/// sqrt(rows) / 2, at least 1, at most rows.
uint32_t automatic_ivf_clusters(uint32_t rows);
/// The clusters of an IVF index over `rows` rows with `given` asked for (--ivf-clusters; 0:
/// automatic_ivf_clusters): at most one a row.
uint32_t ivf_cluster_count(uint32_t given, uint32_t rows);
/// The clusters of the IVF index over `rows` of a layer's `total` rows (a rank's shard; all of
/// them in one process): the whole layer's ivf_cluster_count(given, total) times
/// sqrt(rows / total), what the automatic count gives the shard's rows (and a given count
/// alike), at least 1.
uint32_t ivf_shard_cluster_count(uint32_t given, uint32_t total, uint32_t rows);

/// Whether a CPU backend's exact top-k search (top_k_search::automatic) scores a bf16 copy of
/// the rows on kernels of `level`: where the CPU has bf16 products (vdpbf16ps, or AMX tiles).
/// Only the search's ranking sees the rounding; the set's logits are the fp32 rows'. On a
/// 2-core Zen 5 (avx512bf16, Debian-recs' 6,118 x 256 layer) it halved the search: 0.09 s an
/// epoch against 0.165 in fp32 (bench/peers.md, 2026-12-05).
constexpr bool cpu_exact_search_in_bf16(isa_level level) {
    return level >= isa_level::avx512bf16;
}

/// Whether a CPU backend's exact top-k search (automatic) scores an int8 copy of the rows on
/// kernels of `level`, in place of bf16 or of the fp32 rows: where the level has 8-bit
/// products. On avx512bf16 with AVX512_VNNI (vpdpbusd: twice vdpbf16ps' products an
/// instruction) and on avx2 (vpmaddubsw over 4-bit queries, eight fours' pairs summed by one
/// vpmaddwd: 2.5x fp32's products a second on a 2-core Zen 3: bench/kernels.md, 2026-12-06).
/// AMX tiles keep bf16.
bool cpu_exact_search_in_int8(isa_level level);

/// How many rows an exact top-k search scores on kernels of `level` in the time an IVF search
/// scores one of the rows it probes and keeps its index current: 8 in AMX tiles (bench/
/// peers.md: at 670,091 rows, 48 of 409 clusters probed, the two searches cost the same an
/// epoch) and in vpdpbusd's int8 products (the AVX-512 levels where the CPU has AVX512_VNNI,
/// cpu_exact_search_in_int8: twice vdpbf16ps' products an instruction; bench/topk.md,
/// 2026-12-08, a 2-core Zen 4: the Delicious-200K shape's 205,443 rows, 3 epochs in 0.64x IVF's
/// time, and IVF's P@1 collapsing where exact's rose to 0.28), 4 on the other SIMD levels: in
/// vdpbf16ps products (bench/peers.md, 2026-12-05, a 2-core Zen 5: exact 1.31 s an epoch
/// against IVF's 1.68 at 30,000 rows, 3.14 against 3.89 at 100,000, with the same or a higher
/// P@1; at 670,091 IVF costs about half of exact), and on avx2 (2026-12-06, a 2-core Zen 3, the
/// Amazon-670K shape's 72,295 rows: exact over the int8 copy 8-10 s an epoch against IVF's 9-13
/// at 48 of 134 clusters, P@1 0.667 against 0.592 after 3 epochs; exact in fp32 11.5 s, as
/// fast as IVF already). 1 on the scalar reference.
uint32_t cpu_exact_rows_per_ivf_row(isa_level level);

/// How much fewer products an IVF search must cost than the exact search before `auto` takes
/// it: the index is approximate, and its recall can fall where the exact search's cannot (at
/// the Amazon-670K shape with every label a row, 670,091 rows on a 2-core Zen 4 with
/// AVX512_VNNI, its products 0.94 of the exact search's: an epoch in 1.04x the exact search's
/// time, `farm-bench -n 2`, recall@32 0.19 after it and P@1 0.20 against 0.31 after two;
/// bench/topk.md, 2026-12-08).
inline constexpr uint32_t ivf_min_product_saving = 2;

/// The search a CPU backend whose kernels are of `level` runs for top-k layer `layer`: its
/// `search`, where automatic is a cost model in rows scored: the IVF index scores the share
/// ivf_probes / clusters of the rows (and must be built and refreshed), exact scoring every row,
/// cpu_exact_rows_per_ivf_row(level) times faster than the IVF scores a row (over the
/// selection's int8 or bf16 copy of the rows, exact_top_k, where the kernels have those
/// products). So exact unless the index saves ivf_min_product_saving of the products, that is
/// where ivf_probes * that * ivf_min_product_saving >= the clusters: at the defaults below
/// 37,249 rows on the scalar reference, below 591,361 on avx2 (and avx512 levels without
/// VNNI), and below 2,362,369 on amx and the avx512 levels with VNNI; else ivf. `rows` is how
/// many of the layer's rows the process searches (a rank's shard; 0: all, layer.size): a rank
/// weighs its own search, over its shard and its index of ivf_shard_cluster_count clusters.
top_k_search cpu_top_k_search(const layer_config& layer, isa_level level, uint32_t rows = 0);

/// The network: sparse input of `input_dim` features, ReLU hidden layers, a softmax output
/// layer of `output_dim` neurons (one per label). layers.back() is the output layer.
/// The first layer (whose input is the sparse features) is always dense in its outputs: its
/// weights are stored feature-major (a row per input feature), so its forward pass is a
/// weighted sum of the sample's feature rows.
struct model_config {
    uint32_t input_dim = 0;
    std::vector<layer_config> layers;
    /// `automatic` layers with more neurons are sparse: top-k for the output layer, LSH for a
    /// hidden one (selection())
    uint32_t auto_sparse_min = 4096;
    /// Part of the model, so evaluation and prediction scale inputs as training did. Backends
    /// take inputs already scaled: callers apply it with normalize_inputs (dataset.hpp).
    input_normalization input_norm = input_normalization::l2;

    uint32_t output_dim() const { return layers.empty() ? 0 : layers.back().size; }
    /// How layer `l` chooses its active neurons (layer 0 and `dense` layers: all).
    neuron_selection selection(size_t l) const;
    /// True when layer `l` has LSH hash functions and tables.
    bool uses_lsh(size_t l) const { return selection(l) == neuron_selection::lsh; }
    /// True when layer `l` is computed on a per-sample active set (LSH or top-k).
    bool has_active_sets(size_t l) const { return selection(l) != neuron_selection::all; }
};

/// How Adam treats rows a batch did not touch.
enum class adam_mode {
    sparse,  ///< update only the touched rows (default; lazy Adam with the global step count)
    dense,   ///< SLIDE's behaviour: every row every batch, untouched rows with a zero gradient
    /// dense on the input layer (every feature row moves with its momentum every batch),
    /// sparse on the others (the big output layer moves only its active rows)
    input_dense,
    /// dense Adam's result at sparse cost: a row the batches skipped catches up on its
    /// momentum steps, in closed form, when a step next reads it (CPU backend:
    /// src/cpu/adam_catch_up.hpp); the whole model is brought up to date before predictions
    /// and exports. The cpu-dense backend runs it as dense.
    catch_up,
    /// input-dense's result at sparse cost: catch-up on the input layer only. The GPU backend
    /// runs it as input-dense (a pass over the input layer is cheap there), cpu-dense as dense
    /// on the input layer: the same model.
    input_catch_up,
};
adam_mode parse_adam_mode(const std::string& name);
const char* to_string(adam_mode mode);
/// Whether Adam moves layer l's untouched rows (with a zero gradient) in this mode.
inline bool adam_moves_untouched_rows(adam_mode mode, size_t l) {
    return mode == adam_mode::dense || (mode == adam_mode::input_dense && l == 0);
}
/// Whether layer l's untouched rows catch up on their momentum when next read (catch-up modes).
inline bool adam_catches_up_rows(adam_mode mode, size_t l) {
    return mode == adam_mode::catch_up || (mode == adam_mode::input_catch_up && l == 0);
}
/// Whether layer l's untouched rows end up where dense Adam moves them: moved every step, or
/// caught up later.
inline bool adam_momentum_reaches_untouched_rows(adam_mode mode, size_t l) {
    return adam_moves_untouched_rows(mode, l) || adam_catches_up_rows(mode, l);
}

/// How predictions score the output layer.
enum class scoring_mode {
    automatic,  ///< the output layer's own index: LSH for LSH layers, IVF for top-k layers
                ///< searched by IVF (--top-k-search ivf or auto on a CPU), exact otherwise
    exact,      ///< every output neuron
    /// every output neuron, the products in bf16 (rows and inputs rounded, sums in fp32) where
    /// the CPU multiplies bf16 natively (AMX tiles, AVX-512-BF16), else exact (a quarter of
    /// fp32's time at 670k labels)
    exact_bf16,
    /// every output neuron, ranked in the fastest products the CPU has: where its exact top-k
    /// search scores int8 (cpu_exact_search_in_int8), each point's best candidates in an int8
    /// copy of the rows (2k, at least 16) re-scored in fp32, so that the labels are the exact
    /// ones unless the int8 products missed one; else as exact_bf16 (GPU: exact). --epochs
    /// auto's hold-out, which only ranks epochs against each other.
    exact_fast,
    lsh,  ///< the LSH active set only
    ivf,  ///< a top-k layer's IVF index: the rows of each point's --ivf-probes best clusters
};
/// Whether `mode` scores every output neuron (exact, exact-bf16, exact-fast), whatever index
/// the layer has.
inline bool scores_every_neuron(scoring_mode mode) {
    return mode == scoring_mode::exact || mode == scoring_mode::exact_bf16 ||
           mode == scoring_mode::exact_fast;
}
scoring_mode parse_scoring(const std::string& name);
const char* to_string(scoring_mode mode);

/// The number format a backend computes its products in.
enum class precision_mode {
    fp32,  ///< fp32 throughout
    /// bf16 copies of the weights and of each layer's input feed the forward and backward
    /// products (fp32 accumulation, vdpbf16ps where the CPU has it); the master weights, the
    /// gradients and the Adam moments stay fp32, and a row's bf16 copy is re-rounded
    /// (to nearest even) after each update, so small steps are never lost to bf16's 8 bits.
    bf16,
};
precision_mode parse_precision(const std::string& name);
const char* to_string(precision_mode mode);

/// How Adam stores the moments (m, v) of the weights past the input layer (the output layer's
/// in the usual two-layer network; biases' moments and the input layer's stay fp32).
enum class moment_storage {
    fp32,  ///< as the weights
    /// bf16, rounded stochastically (unbiased: a step's change of v, 0.1% with beta2 = 0.999,
    /// is below half a bf16 unit, and round-to-nearest would freeze it): half the memory of
    /// those moments and 30% less traffic in their update. CPU backend; P@1 within 0.003 of
    /// fp32 on the default run (bench/topk.md)
    bf16,
};
moment_storage parse_moment_storage(const std::string& name);
const char* to_string(moment_storage storage);

/// How the learning rate moves over a run.
enum class lr_schedule {
    constant,  ///< `learning_rate` throughout
    linear,    ///< from `learning_rate` down to 0 at the end of the last epoch
};
lr_schedule parse_lr_schedule(const std::string& name);
const char* to_string(lr_schedule schedule);

/// How the learning rate follows the batch size: a large-batch rule. Bigger batches take fewer
/// steps an epoch, so at the same rate they learn less per epoch (on the GPU, batch 1024 reached
/// a third of batch 256's P@1 after 2 epochs: issue #20); a rule scales the rate with the batch,
/// relative to the batch the rate was tuned at (`lr_base_batch`).
enum class lr_batch_scaling {
    none,    ///< `learning_rate` whatever the batch
    sqrt,    ///< times sqrt(batch_size / lr_base_batch): Adam's rule (Malladi et al., 2022)
    linear,  ///< times batch_size / lr_base_batch: SGD's rule (Goyal et al., 2017)
};
lr_batch_scaling parse_lr_batch_scaling(const std::string& name);
const char* to_string(lr_batch_scaling scaling);

/// Optimisation and schedule settings.
struct train_config {
    /// Epochs in total (counting resumed ones): exactly this many, or with epochs_auto the
    /// most the run may train (its cap).
    uint32_t epochs = 10;
    /// --epochs auto (the front ends' default; this struct's default stays a fixed count):
    /// validate after every epoch, stop when the metric has not improved for the patience,
    /// and end with the best epoch's model. The trainer then needs a validation set; the
    /// front ends hold one out of the training data when the user gives none. The defaults
    /// (cap, patience, hold-out) are auto_epochs_defaults in validation.hpp.
    bool epochs_auto = false;
    uint32_t batch_size = 128;
    float learning_rate = 3e-3f;
    lr_schedule schedule = lr_schedule::constant;
    lr_batch_scaling lr_scaling = lr_batch_scaling::none;
    uint32_t lr_base_batch = 256;
    /// Samples over which the rate ramps up linearly from 0 at the start of training (0 = none);
    /// large scaled rates want it.
    uint64_t warmup_samples = 0;
    /// The model a run evaluates, keeps and saves: an exponential moving average of the
    /// weights with this time constant in epochs (weight_average.hpp), or the weights
    /// themselves (0). -1 (the front ends' default; this struct's default stays 0):
    /// weight_average_auto_epochs (0.5) where the backend holds its model in host memory (the
    /// CPU ones; a sharded run's ranks each average what they hold, where every rank can),
    /// else 0. A backend holding its model elsewhere (GPU, hybrid) averages when asked, each
    /// update exporting its model (host memory for it and the average).
    double ema_epochs = 0;
    /// A top-k output layer searched exactly (on the CPU, in one process) reuses a training
    /// point's candidates from its last search while that search is fewer than
    /// reuse_candidates_steps steps old (candidate_cache.hpp); 0 = search every time. The
    /// front ends set it from --reuse-candidates EPOCHS (resolve_auto_training): -1, their
    /// default, is 1 epoch where the backend is cpu in one process and the output layer has
    /// reuse_candidates_min_rows rows or more, else 0. Searches of the first such period are
    /// not kept (the model moves fastest then).
    double reuse_candidates_epochs = 0;
    /// An output layer whose top-k `auto` searches through an IVF index (on the CPU, in one
    /// process) gives the index up for the exact search once the selection probe
    /// (trainer_options::selection_probe_points: after each epoch, and within the first at
    /// steps 64, 128, 256, ...) finds it holding less than this share of the exact top
    /// (selection_quality::top_recall): a stale or lopsided index lets rows the sets
    /// miss rise unchecked and take over the predictions (bench/topk.md). 0 = never; the front
    /// ends default it to front_end_ivf_min_recall. A search the user chose (--top-k-search
    /// ivf) is kept whatever its recall.
    double ivf_min_recall = 0;
    uint64_t reuse_candidates_steps = 0;
    uint32_t reuse_candidates_min_rows = 0;
    /// The output layer's loss (loss.hpp): the set's softmax, or a logistic loss per member
    /// (whose output biases start at the labels' prior: logistic_prior_bias).
    output_loss loss = output_loss::softmax;
    float adam_beta1 = 0.9f;
    float adam_beta2 = 0.999f;
    float adam_epsilon = 1e-8f;
    adam_mode adam = adam_mode::input_catch_up;
    moment_storage adam_moments = moment_storage::fp32;
    /// Samples between LSH table rebuilds at the start; the period then grows by
    /// exp(rebuild_decay) after every rebuild (SLIDE's exponential decay of the rebuild rate).
    uint64_t rebuild_every = 6400;
    double rebuild_decay = 0.05;
    /// Samples between draws of new hash functions (0 = never).
    uint64_t rehash_every = 128000;
    int threads = 0;  ///< 0 = all OpenMP threads
    /// Initialisation, shuffles and sampling. The CPU backend gives bit-identical runs for a
    /// seed at any thread count.
    uint64_t seed = 1;
};

/// Adam's bias corrections after `t` steps (t >= 1): c1 = 1 / (1 - beta1^t) and
/// c2 = 1 / (1 - beta2^t), computed in double as every backend applies them.
struct adam_corrections {
    float c1, c2;
};
adam_corrections adam_bias_corrections(const train_config& train, uint64_t t);

/// The learning rate at the start of the schedule: learning_rate under the batch-size rule.
float scaled_learning_rate(const train_config& train);

/// Every name an enum setting takes, in its table's order (the choices the CLI and its help
/// list; the argument only picks the overload).
std::vector<std::string> names_of(sparsity_mode);
std::vector<std::string> names_of(input_normalization);
std::vector<std::string> names_of(top_k_search);
std::vector<std::string> names_of(adam_mode);
std::vector<std::string> names_of(scoring_mode);
std::vector<std::string> names_of(precision_mode);
std::vector<std::string> names_of(moment_storage);
std::vector<std::string> names_of(lr_schedule);
std::vector<std::string> names_of(lr_batch_scaling);

/// Throws hslide::error naming the setting when a configuration cannot work.
void validate(const model_config& model);
/// --ivf-min-recall's default on the command line and in hslide.Model: below it, an automatic
/// IVF search has lost enough of the top that its run learns less than the exact search's.
inline constexpr double front_end_ivf_min_recall = 0.95;

void validate(const train_config& train);
/// What a model and its training settings cannot do together (a backend's constructor checks
/// it): the fill's log-Q correction under the logistic loss, which has no softmax to correct.
void validate(const model_config& model, const train_config& train);

}  // namespace hslide

namespace hslide {

/// The model configuration as a JSON text (for checkpoints and --print-config), and back.
/// from_json throws hslide::error naming the missing or bad key.
std::string model_config_to_json(const model_config& config);
model_config model_config_from_json(const std::string& json_text);

}  // namespace hslide
