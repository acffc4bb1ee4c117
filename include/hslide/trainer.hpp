// The training loop every backend shares: epochs over a fresh seeded shuffle, batches,
// the table rebuild/rehash schedule, evaluation, metrics records and checkpoints.
#pragma once

#include "hslide/backend.hpp"
#include "hslide/config.hpp"
#include "hslide/dataset.hpp"
#include "hslide/label_map.hpp"
#include "hslide/metrics.hpp"
#include "hslide/model.hpp"
#include "hslide/shard_comm.hpp"
#include "hslide/validation.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace hslide {

/// How to evaluate a model on a test set.
struct evaluation_options {
    /// exact by default: P@k of the model itself, as the published SLIDE systems report it
    /// (LSH scoring measures the model and its tables' recall together).
    scoring_mode scoring = scoring_mode::exact;
    size_t max_points = 0;      ///< evaluate on the first max_points test points (0 = all)
    uint32_t batch_size = 512;  ///< points per predict() call
    metrics_config metrics;
    bool show_progress = true;
};

/// Evaluates the model `engine` holds on `test`: P@k, nDCG@k, and PSP@k when
/// `inverse_propensities` is given.
metrics_result evaluate(backend& engine, const dataset& test, const evaluation_options& options,
                        const std::vector<double>& inverse_propensities = {});

/// Refuses (out_of_memory_error) a run that cannot fit in the host's memory, before its model
/// is made: the model with Adam state (which model_state::create checks alone), the copies of
/// its weights training keeps (the weight average unless train.ema_epochs is 0, the best
/// epoch's snapshot where `keeps_best`) and a step's hidden activations and their gradients.
/// Without it a hidden layer of 10^8 passed the model's own check and was killed by the
/// kernel partway through its first step, with whatever else ran on the machine.
void check_training_memory(const model_config& config, const train_config& train,
                           size_t train_points, bool keeps_best);

/// The trainer's own state: what a checkpoint needs besides the model to resume exactly.
struct trainer_state {
    uint32_t epochs_done = 0;
    uint64_t samples_seen = 0;
    uint64_t next_rebuild = 0;  ///< samples_seen at which tables are next rebuilt
    double rebuild_period = 0;  ///< current period (grows by exp(rebuild_decay))
    uint64_t next_rehash = 0;   ///< samples_seen at which new hash functions are drawn
    uint64_t shuffle_rng[4] = {0, 0, 0, 0};
    double seconds = 0;  ///< wall time of training and evaluation so far
    /// Written by an --epochs auto run (train_config::epochs_auto): resuming needs the same
    /// mode, since its training set left the held-out points out.
    bool epochs_auto = false;
    /// With a validation set: the best epoch so far (0: none yet) and its metric's value. An
    /// --epochs auto run's checkpoint holds that epoch's model, so a run resumed from it
    /// carries on from the best with its patience as the uninterrupted run would.
    uint32_t best_epoch = 0;
    double best_value = 0;
    /// The last epoch that improved (validation_options::min_gain), from which patience
    /// counts, and its metric's value: the best epoch's where min_gain is 0.
    uint32_t improved_epoch = 0;
    double improved_value = 0;
    /// Plateaus answered so far by going back to the best epoch at a lower learning rate
    /// (validation_options::lr_drops): the rate is multiplied by lr_drop_factor^lr_drops.
    uint32_t lr_drops = 0;
    /// The epoch whose model the latest drop went on from: the drop's epochs are those after
    /// it (validation_options::epochs_per_drop).
    uint32_t lr_dropped_after = 0;
};

/// One rank's figures of an epoch in a run sharded across ranks (every rank's are gathered
/// into each epoch_record). Plain numbers: they travel as bytes.
struct rank_figures {
    uint32_t rank = 0;
    uint32_t output_first = 0;  ///< its rows of the output layer: [first, first + rows)
    uint32_t output_rows = 0;
    uint32_t unused = 0;
    uint64_t output_layer_bytes = 0;  ///< their weights, biases and Adam state (backend_info)
    uint64_t memory_bytes = 0;        ///< the rank's model replica (backend_info)
    uint64_t peak_rss_bytes = 0;      ///< the rank's process, so far
    /// The epoch's training steps and their collectives: how many, the bytes received from
    /// the other ranks, the seconds inside them.
    uint64_t steps = 0;
    uint64_t collectives = 0;
    uint64_t transfer_bytes = 0;
    double transfer_seconds = 0;
};

/// One evaluation record (one line of --metrics-out).
struct epoch_record {
    uint32_t epoch = 0;
    double seconds = 0;        ///< wall time since training began (evaluations included)
    double epoch_seconds = 0;  ///< this epoch's training wall time
    double samples_per_s = 0;
    double loss = 0;  ///< mean training loss over the epoch
    double mean_active_output = 0;
    /// Top-k output layers: the mean softmax mass of the output rows a sample's active set
    /// left out (their gradient is dropped); unset for other selections.
    std::optional<double> dropped_mass;
    /// The mean share of the output layer's rows a step's update touched (backends that count
    /// them: the CPU ones).
    std::optional<double> touched_share;
    /// The active sets against exact scoring on a fixed sample of training points, after the
    /// epoch (backends that measure it: the CPU one), and the seconds it took (counted in
    /// `seconds`, not in `epoch_seconds`).
    std::optional<selection_quality> selection;
    double selection_seconds = 0;
    stage_times times;                  ///< summed over the epoch
    std::vector<worker_stats> workers;  ///< per worker of a hybrid backend (else empty)
    /// The epoch's training steps, and their collectives across ranks (a sharded run's: how
    /// many, the bytes this rank received; times.transfer holds their seconds).
    uint64_t steps = 0;
    uint64_t collectives = 0;
    uint64_t transfer_bytes = 0;
    /// A sharded run (trainer_options::ranks): every rank's figures, rank r's at [r].
    std::vector<rank_figures> ranks;
    bool evaluated = false;
    metrics_result metrics;
    double eval_seconds = 0;
    /// With a validation set (validation_options): its metrics after this epoch, and the best
    /// epoch so far by the chosen metric (this one or an earlier one).
    bool validated = false;
    metrics_result valid_metrics;
    double valid_seconds = 0;
    uint32_t best_epoch = 0;
};

/// Options of a training run.
struct trainer_options {
    train_config train;
    evaluation_options eval;
    /// Evaluate the test set every this many epochs (0 = only at the end: with keep_best, the
    /// kept model only; the CLI's default under --epochs auto).
    uint32_t eval_every = 1;
    std::string metrics_out;  ///< JSONL file, one record per evaluation ("" = none)
    /// Checkpoint written after every epoch ("" = none); under --epochs auto, after every
    /// epoch that improved on the best (so it always holds the best model so far).
    std::string save_path;
    /// The labels the output rows stand for, saved with every checkpoint (label_map.hpp; the
    /// datasets the trainer is given already hold row ids).
    label_map rows;
    /// Where a resumed run starts (from its checkpoint; the backend already holds the
    /// checkpoint's model). Unset: a fresh start.
    std::optional<trainer_state> resume;
    /// A resumed run whose checkpoint holds an average of the weights (the backend holds
    /// it): the weights the optimizer was at (checkpoint_contents::training_weights), from
    /// which training goes on. Unset: training goes on from the weights the backend holds.
    std::optional<model_state> resume_training_weights;
    /// Training points on which the active sets are measured after every epoch (0 = never; -1 =
    /// auto: auto_selection_probe_points where the backend's selection is approximate, LSH or
    /// an IVF index, none where its sets hold the exact top by construction:
    /// backend::selection_is_exact), and how many exact top logits their recall is against.
    int32_t selection_probe_points = -1;
    static constexpr uint32_t auto_selection_probe_points = 256;
    uint32_t selection_probe_top = 32;
    bool show_progress = true;
    validation_options validation;  ///< validation set, best epoch, early stopping
    /// Called after every training step, on the thread that runs the trainer; may throw to
    /// abandon the run mid-epoch (the Python module raises KeyboardInterrupt there on Ctrl-C,
    /// which otherwise would wait for the epoch's end). Empty: nothing is called.
    std::function<void()> between_steps;
    /// Whether the backend must hold the kept model's Adam state when run() returns, for a
    /// caller that saves it or trains on (the Python module's fit). False (the command line,
    /// which saves only through save_path): the best epoch's snapshot keeps the weights alone
    /// unless a drop of the rate or a checkpoint needs its moments, a third of its memory
    /// (peak memory 1.47 -> 1.08 GiB at the Amazon-670K shape, bench/peers.md); a run that
    /// goes back to an earlier epoch then ends with that epoch's weights and the last
    /// epoch's moments.
    bool optimizer_after_run = true;
    /// Called after every checkpoint written to save_path (a sharded run's ranks each write
    /// their file there; the hook then writes the manifest). Empty: nothing is called.
    std::function<void()> after_checkpoint;
    /// A run sharded across ranks: their group. At every epoch's end each rank's figures
    /// (rank_figures) are gathered into the record on every rank, so that rank 0's
    /// --metrics-out holds them all. Every rank's trainer must have it. Null: one process.
    shard_comm* ranks = nullptr;
    /// A sharded run whose ranks compute the replicated layers differently (other backends,
    /// CPU instruction sets or precisions: their float sums round differently, so their
    /// replicas would drift apart by roundings): at every epoch's end, before the ranks check
    /// their replicas, rank 0's replicated layers (with their Adam state, and its weight
    /// average's) are copied to every rank. Every rank's trainer must say the same.
    bool replicas_differ = false;
};

/// Runs training on `engine` (a backend holding the initial replica of the model).
class trainer {
  public:
    trainer(backend& engine, const dataset& train, const dataset* test, trainer_options options);

    /// Trains up to options.train.epochs epochs in total (counting resumed ones); returns one
    /// record per epoch run. `on_epoch` (optional) sees each record as it is made. Under
    /// epochs_auto, validates after every epoch, keeps the best model and stops after the
    /// patience (options.validation, whose keep_best and patience auto sets).
    std::vector<epoch_record> run(const std::function<void(const epoch_record&)>& on_epoch = {});

    const trainer_state& state() const { return state_; }
    /// The best epoch by the validation metric (0 without a validation set or before one): a
    /// later epoch is best when it scores higher, and the first epoch at a dropped rate when it
    /// scores within holdout_noise(best_value(), validation points) of the best (the anneal is
    /// kept unless the hold-out finds it worse beyond its noise). With keep_best, after run()
    /// the backend holds its model.
    uint32_t best_epoch() const { return best_epoch_; }
    /// The validation metric's value at best_epoch().
    double best_value() const { return best_value_; }
    /// The epochs done when run() ended (before keep_best went back to the best one), not
    /// counting those undone at a plateau (lr_drops).
    uint32_t epochs_run() const { return epochs_run_; }
    /// The epochs trained and then undone at plateaus (validation_options::lr_drops).
    uint32_t epochs_undone() const { return epochs_undone_; }
    /// With keep_best, after run(): the kept model's record (the best epoch's, with the test
    /// metrics of that model when there is a test set; --metrics-out's last line, marked
    /// "final"). Unset otherwise.
    const std::optional<epoch_record>& final_record() const { return final_record_; }
    /// The options the run uses (epochs_auto's keep_best and patience filled in).
    const trainer_options& options() const { return options_; }
    /// Asks run() to stop after the epoch under way (from on_epoch, e.g. a Python callback).
    void request_stop() { stop_requested_ = true; }
    /// An epoch's record as one JSON object: the line --metrics-out writes.
    std::string record_json(const epoch_record& record) const;
    /// The time constant in epochs of the weight average the run evaluates, keeps and saves
    /// (train_config::ema_epochs with auto resolved); 0 when it uses the weights themselves.
    double ema_epochs() const { return ema_epochs_; }

  private:
    /// One epoch; with `synchronize_at_end`, waits until an asynchronous backend applied it.
    epoch_record run_epoch(bool synchronize_at_end);
    /// The learning rate of the next step under the schedule (a function of samples seen, so
    /// a resumed run continues the same schedule).
    float learning_rate_now() const;
    void write_metrics_record(const epoch_record& record);
    /// A sharded run: every rank's figures of the epoch into record.ranks (a collective).
    void gather_rank_figures(epoch_record& record);
    /// trainer_options::replicas_differ's copy of rank 0's replicated layers (a collective).
    void copy_first_ranks_replicas();
    /// Evaluates the test set into `record` (its metrics and seconds, counted in the run's).
    void test_into(epoch_record& record);
    /// Evaluates the validation set into `record`, and keeps the model when it is the best.
    void validate_epoch(epoch_record& record);
    void save_checkpoint_now();
    /// After a drop: its epochs (validation_options::epochs_per_drop) are all trained.
    bool drop_epochs_spent() const;
    /// What the drops so far multiply the learning rate by (lr_drop_factor^lr_drops).
    double lr_drop_multiplier() const;
    /// A drop of the rate: the trainer state becomes the best epoch's with one drop more, after
    /// it; the `undone` epochs trained past the best are counted (the caller brings the best
    /// epoch's model back where there are any).
    void drop_rate(uint32_t undone);
    /// The backend goes back to the best epoch's model (best_model_), and the average to the
    /// best epoch's.
    void restore_best_model();
    /// Whether the best epoch's snapshot holds its Adam state: for a drop (which trains on from
    /// it), a checkpoint (which a resumed run trains on from) or the caller
    /// (trainer_options::optimizer_after_run). The same all run: the options are resolved once.
    bool best_needs_optimizer() const;
    /// " by more than M x its hold-out noise (N)" where validation_options::min_gain is set,
    /// else "": what a plateau's message says the epochs fell short of.
    std::string gain_wanted() const;

    /// The model the backend trains, in host memory with every row up to date (for the
    /// average's ticks); nullptr where the backend holds it elsewhere.
    const model_state* current_parameters();
    /// A tick of the weight average (weight_average.hpp).
    void tick_average();
    /// With an average: the backend holds the average's weights (for evaluation, the best
    /// model's snapshot and checkpoints) and shown_training_weights() the weights it trains,
    /// until hide_average() puts those back. Nothing without an average or when already so.
    void show_average();
    void hide_average();
    /// While the average is shown, the weights training is at (else nullptr).
    const model_state* shown_training_weights() const;

    backend& backend_;  // holds the model being trained
    const dataset& train_;
    const dataset* test_;
    trainer_options options_;
    trainer_state state_;
    std::vector<uint32_t> label_counts_;  // of the training set: for PSP@k and checkpoints
    std::vector<double> inverse_propensities_;
    std::vector<uint32_t> probe_rows_;  // training points the selection is measured on
    // Whether the first epoch still probes as it goes (until a probe says the backend's search
    // cannot give way: selection_quality::index_may_give_way).
    bool probes_within_epoch_ = true;
    /// Whether the first epoch probes the selection after `steps` steps of its `total`: at
    /// 64, 128, 256, ... steps, before its last, while an automatic index may give way.
    bool probe_due_within_epoch(uint64_t steps, uint64_t total) const;
    /// The backend's measure of its selection on probe_rows_.
    selection_quality probe_selection();
    /// Says that the backend gave its index up after a probe `q` (at `when`), and stops the
    /// automatic probe: an exact search is what it does not measure.
    void index_given_up(const selection_quality& q, const std::string& when);
    uint32_t best_epoch_ = 0;
    double best_value_ = 0;
    std::optional<model_state> best_model_;  // keep_best: the best epoch's model
    trainer_state best_state_;
    std::optional<epoch_record> best_record_;   // keep_best: the best epoch's record
    std::optional<epoch_record> final_record_;  // keep_best: the kept model's, after run()
    double ema_epochs_ = 0;
    float average_keep_ = 0;  // weight_average_keep(ema_epochs_); 0: no average
    model_state average_;     // the weights' average (no layers before its first tick)
    model_state exported_;    // a tick's export of a model not held in host memory
    // show_average() on a backend that cannot swap (row_transfer::swap_parameters): the
    // weights it trains; where it swapped (swapped_), average_ holds them meanwhile.
    model_state training_weights_;
    bool showing_average_ = false;
    bool swapped_ = false;
    model_state best_training_weights_;  // keep_best with an average: the best epoch's (or none)
    uint32_t epochs_run_ = 0;
    uint32_t epochs_undone_ = 0;
    bool stop_requested_ = false;
};

}  // namespace hslide
