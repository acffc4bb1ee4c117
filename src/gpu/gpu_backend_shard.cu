// The CUDA backend's label-sharded output layer (gpu_backend.hpp's create_gpu_backend, issue
// 32): one rank's training step, the check of its replicas, and what it refuses. The GPU does
// what reads the rows (scoring, the members' logits, the hidden gradient's share, the updates);
// the host does what the ranks share, with the CPU backend's code (the candidates' merge, the
// sets, the set softmax, the sums over ranks), so that GPU ranks build the CPU ranks' sets and
// every rank holds the same replicated layer. A step moves O(batch x (k + set + hidden))
// values between device and host, as between ranks; it is synchronous.
#include "gpu_backend_impl.cuh"

#include "cpu/shard_merge.hpp"
#include "hslide/clock.hpp"

#include <spdlog/spdlog.h>

#include <omp.h>

namespace hslide::gpu {

void gpu_backend::check_shardable() const {
    const layer_config& c = shape_.config.layers[1];
    const int ranks = shard_.comm->size();
    HSLIDE_CHECK_KIND(!shape_.config.uses_lsh(1), error_kind::unsupported,
                      "--output-sparsity lsh: GPU ranks ({} ranks) shard a top-k (exact) or "
                      "dense output layer; LSH output layers are sharded on --backend cpu ranks",
                      ranks);
    HSLIDE_CHECK_KIND(c.fill_correction == 0.0f, error_kind::unsupported,
                      "--fill-correction is not sharded across MPI ranks ({} ranks): leave it at 0",
                      ranks);
    HSLIDE_ASSERT(shape_.layers[1].rows == shard_.count && shard_.total == c.size &&
                  shard_.first + shard_.count <= shard_.total);
}

uint32_t gpu_backend::build_shard_sets(const batch_view& batch, uint64_t& set_entries) {
    const uint32_t b = batch.size, first = shard_.first, count = shard_.count;
    const uint32_t total_rows = shard_.total;
    const layer_config& c = shape_.config.layers[1];
    shard_host& h = shard_host_;
    h.offsets.assign(size_t(b) + 1, 0);
    h.label_members.assign(b, 0);
    h.ids.clear();
    h.entry_sample.clear();
    set_entries = 0;
    if (dense_output_) {
        // Every row: a labelled sample's members are the shard's rows, its labels their rows.
        // The entries are counted in 32 bits, and sorted by CUB with an int count.
        HSLIDE_CHECK_KIND(uint64_t(b) * count < (uint64_t{1} << 31), error_kind::unsupported,
                          "a dense output layer sharded across GPU ranks: a step of {} samples "
                          "over this rank's {} rows is {} entries, above 2^31; use a smaller "
                          "--batch-size, more ranks, or --output-sparsity topk",
                          b, count, uint64_t(b) * count);
        shard_label_rows(*batch.data, batch.rows, b, first, count, h.label_index, h.label_begin);
        for (uint32_t s = 0; s < b; ++s) {
            if (batch.data->labels(batch.rows[s]).count > 0) {
                for (uint32_t r = 0; r < count; ++r) {
                    h.ids.push_back(r);
                    h.entry_sample.push_back(s);
                }
                set_entries += total_rows;
            }
            h.offsets[s + 1] = uint32_t(h.ids.size());
            h.label_members[s] = h.label_begin[s + 1] - h.label_begin[s];
        }
        return uint32_t(h.ids.size());
    }
    // Exact top-k: this rank's k best (ids local to the shard, padded where the shard has
    // fewer rows), merged with the other ranks' into the whole layer's k best, with the
    // whole layer's log-partition.
    const uint32_t k = std::min(c.top_k, total_rows), kept = std::min(k, count);
    score_top_k(layers_[1].view(), hidden_.data(), use_bf16() ? hidden16_.data() : nullptr,
                layers_[0].stride, use_bf16(), b, kept, /*chunk=*/0, blas_, exact_, stream_);
    h.best.assign(size_t(b) * k, UINT32_MAX);
    h.best_score.assign(size_t(b) * k, -INFINITY);
    h.log_partition32.resize(b);
    HSLIDE_CUDA_CHECK(cudaMemcpy2DAsync(h.best.data(), size_t(k) * 4, exact_.best_id.data(),
                                        size_t(kept) * 4, size_t(kept) * 4, b,
                                        cudaMemcpyDeviceToHost, stream_));
    HSLIDE_CUDA_CHECK(cudaMemcpy2DAsync(h.best_score.data(), size_t(k) * 4,
                                        exact_.best_score.data(), size_t(kept) * 4,
                                        size_t(kept) * 4, b, cudaMemcpyDeviceToHost, stream_));
    HSLIDE_CUDA_CHECK(cudaMemcpyAsync(h.log_partition32.data(), exact_.log_partition.data(),
                                      size_t(b) * 4, cudaMemcpyDeviceToHost, stream_));
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    h.log_partition.assign(h.log_partition32.begin(), h.log_partition32.end());
    // In the chunks every rank merges in (a CPU rank's search's), so that the collectives of
    // GPU and CPU ranks pair up at any batch size.
    const uint32_t merge_chunk = cpu::shard_merge_chunk(k);
    for (uint32_t begin = 0; begin < b; begin += merge_chunk) {
        const uint32_t n = std::min(merge_chunk, b - begin);
        cpu::merge_shard_top_k(*shard_.comm, first, n, k, h.best.data() + size_t(begin) * k,
                               h.best_score.data() + size_t(begin) * k,
                               h.log_partition.data() + begin, h.merge_scratch);
    }
    // The sets over the whole layer, as the CPU's ranks build them (the same seeds and pool),
    // then this rank's members in set order (labels first), as local ids.
    const uint64_t step = shape_.adam_step;
    const uint32_t fill = std::min(c.active.min_active, total_rows);
    const fill_pool pool{step_seed(train_.seed, seed_stream::fill_pool, step),
                         fill_pool_size(c.fill_pool, total_rows, fill, b)};
    const uint64_t sample_seed = step_seed(train_.seed, seed_stream::train_sample, step);
    for (uint32_t s = 0; s < b; ++s) {
        const label_row y = batch.data->labels(batch.rows[s]);
        if (y.count > 0) {  // a sample without labels gets no set (it is not trained)
            rng gen(derive_seed(sample_seed, uint64_t(s)));
            cpu::build_top_k_set(h.best.data() + size_t(s) * k, k, y, fill, pool, total_rows, gen,
                                 h.marks, h.set);
            set_entries += h.set.size();
            for (size_t i = 0; i < h.set.size(); ++i)
                if (h.set[i] - first < count) {
                    h.label_members[s] += i < y.count;
                    h.ids.push_back(h.set[i] - first);
                    h.entry_sample.push_back(s);
                }
        }
        h.offsets[s + 1] = uint32_t(h.ids.size());
    }
    return uint32_t(h.ids.size());
}

step_report gpu_backend::sharded_train_batch(const batch_view& batch, float learning_rate) {
    activate();
    const drain_on_throw drain(stream_);
    shard_comm& comm = *shard_.comm;
    shard_host& h = shard_host_;
    step_report report;
    stage_times& st = report.times;
    const auto t0 = clock_type::now();
    const shard_comm::traffic_count before = comm.traffic();
    // Each stage's wall time less its collectives' (the step's transfer).
    auto t = t0;
    double comm_mark = before.seconds;
    auto stage_end = [&](double& seconds) {
        const double comm_now = comm.traffic().seconds;
        seconds += seconds_since(t) - (comm_now - comm_mark);
        st.transfer += comm_now - comm_mark;
        comm_mark = comm_now;
        t = clock_type::now();
    };
    const uint32_t b = batch.size, width = layers_[0].width, stride = layers_[0].stride;
    const float inv_batch = 1.0f / float(b);
    const bool every_row = dense_output_;

    forward_first_layer(batch, nullptr);
    stage_end(st.forward);  // queued: the GPU's time lands in the stage that waits for it
    // The sets (the merge's collective inside), uploaded as the step's active sets.
    uint64_t set_entries = 0;
    const uint32_t total = build_shard_sets(batch, set_entries);
    active_.offsets.reserve(size_t(b) + 1, "active sets");
    active_.ids.reserve(std::max(total, 1u), "active sets");
    active_.entry_sample.reserve(std::max(total, 1u), "active sets");
    auto upload = [&](auto* to, const auto& from) {
        if (!from.empty())
            HSLIDE_CUDA_CHECK(cudaMemcpyAsync(to, from.data(), from.size() * sizeof(from[0]),
                                              cudaMemcpyHostToDevice, stream_));
    };
    upload(active_.offsets.data(), h.offsets);
    upload(active_.ids.data(), h.ids);
    upload(active_.entry_sample.data(), h.entry_sample);
    stage_end(st.active_sets);

    // The members' logits, then the set softmax over ranks on the host.
    logits_.reserve(std::max(total, 1u), "active logits");
    delta_.reserve(std::max(total, 1u), "active gradients");
    sparse_output_forward(layers_[1].view(), hidden_.data(), hidden16_.data(), use_bf16(),
                          active_.ids.data(), active_.entry_sample.data(), total, logits_.data(),
                          stream_);
    h.logits.reserve(std::max(total, 1u), "active logits (host)");
    h.delta.reserve(std::max(total, 1u), "active gradients (host)");
    if (total > 0)
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(h.logits.data(), logits_.data(), size_t(total) * 4,
                                          cudaMemcpyDeviceToHost, stream_));
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    h.softmax.assign(b, shard_softmax_sample{});
    uint32_t labelled = 0;
    for (uint32_t s = 0; s < b; ++s) {
        shard_softmax_sample& x = h.softmax[s];
        x.logits = h.logits.data() + h.offsets[s];
        x.delta = h.delta.data() + h.offsets[s];
        x.members = h.offsets[s + 1] - h.offsets[s];
        x.label_index = every_row ? h.label_index.data() + h.label_begin[s] : nullptr;
        x.label_members = h.label_members[s];
        x.labels = batch.data->labels(batch.rows[s]).count;
        x.log_partition = every_row ? 0.0 : h.log_partition[s];
        labelled += x.labels > 0;
    }
    const bool logistic = train_.loss == output_loss::logistic;
    if (logistic)
        sharded_set_logistic(comm, h.softmax.data(), b, omp_get_max_threads(), h.softmax_scratch);
    else
        sharded_set_softmax(comm, h.softmax.data(), b, /*full_partition=*/!every_row,
                            omp_get_max_threads(), h.softmax_scratch);
    if (total > 0)
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(delta_.data(), h.delta.data(), size_t(total) * 4,
                                          cudaMemcpyHostToDevice, stream_));
    for (const shard_softmax_sample& x : h.softmax) {
        report.loss_sum += x.loss;
        report.dropped_mass_sum += x.dropped_mass;
    }
    if (!every_row && !logistic) report.full_softmax_samples = labelled;
    stage_end(st.forward);

    // This rank's share of the hidden gradient in double, summed over ranks in rank order and
    // rounded once (every rank the same bits), then through the ReLU.
    shard_share_.reserve(size_t(b) * width, "hidden gradient shares");
    hidden_gradient_share_f64(layers_[1].view(), use_bf16(), active_.offsets.data(),
                              active_.ids.data(), delta_.data(), b, shard_share_.data(), stream_);
    const size_t shares = size_t(b) * width, gradients = size_t(b) * stride;
    h.share.reserve(shares, "hidden gradient shares (host)");
    HSLIDE_CUDA_CHECK(cudaMemcpyAsync(h.share.data(), shard_share_.data(), shares * sizeof(double),
                                      cudaMemcpyDeviceToHost, stream_));
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    comm.all_reduce_sum(h.share.data(), shares);
    // The upload of the step before read this block: done (the update's wait came after it).
    h.d_hidden.reserve(gradients, "hidden gradients (host)");
    std::fill(h.d_hidden.data(), h.d_hidden.data() + gradients, 0.0f);
    for (uint32_t s = 0; s < b; ++s)
        for (uint32_t j = 0; j < width; ++j)
            h.d_hidden.data()[size_t(s) * stride + j] =
                float(h.share.data()[size_t(s) * width + j]);
    HSLIDE_CUDA_CHECK(cudaMemcpyAsync(d_hidden_.data(), h.d_hidden.data(), gradients * 4,
                                      cudaMemcpyHostToDevice, stream_));
    relu_backward(hidden_.data(), b, stride, d_hidden_.data(), stream_);
    stage_end(st.backward);

    // The updates: this rank's rows, and the replicated layer as every rank does it.
    reserve_first_layer_update(batch_nnz_);
    const step_adam adam = adam_for_step(learning_rate);
    shard_touched_.reserve(1, "touched rows");
    shard_touched_.data()[0] = 0;
    output_rows_update(total, inv_batch, adam.output, shard_touched_.data());
    first_layer_update(b, batch_nnz_, inv_batch, adam.input);
    count_step(adam.input);
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    stage_end(st.update);

    report.samples = b;
    report.collectives = comm.traffic().collectives - before.collectives;
    report.transfer_bytes = comm.traffic().bytes - before.bytes;
    report.active_per_layer = {uint64_t(b) * width, set_entries};
    report.output_touched_share_sum = double(shard_touched_.data()[0]) / double(shard_.count);
    report.steps_counted = 1;
    report.seconds = seconds_since(t0);
    last_batch_ = b;
    return report;
}

void gpu_backend::check_replicas() {
    // The replicated layer with its Adam state and the step count, hashed as the CPU backend's
    // ranks hash theirs.
    model_state replica;
    replica.layers.resize(1);
    layer_state& layer = replica.layers[0];
    const device_layer& src = layers_[0];
    auto get = [&](auto& to, const device_array<float>& from) {
        to.resize(from.size());
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(to.data(), from.data(), from.size() * sizeof(float),
                                          cudaMemcpyDeviceToHost, stream_));
    };
    get(layer.weights, src.weights);
    get(layer.adam_m, src.adam_m);
    get(layer.adam_v, src.adam_v);
    get(layer.bias, src.bias);
    get(layer.bias_m, src.bias_m);
    get(layer.bias_v, src.bias_v);
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const uint64_t checksum = replicated_layers_checksum(shape_.adam_step, &layer, 1);
    shard_.comm->check_same(checksum,
                            "the replicated layers' checksum (they must stay bit-identical)");
    spdlog::debug("the replicated layers are the same on all {} ranks (checksum {:016x})",
                  shard_.comm->size(), checksum);
}

double measure_gpu_scoring_rate(int device, uint32_t width, bool bf16) {
    int n_gpus = 0;
    const cudaError_t count_status = cudaGetDeviceCount(&n_gpus);
    cudaGetLastError();  // reported below, not left for a later check
    HSLIDE_CHECK_KIND(
        count_status == cudaSuccess && device >= 0 && device < n_gpus, error_kind::unsupported,
        "--shard-weights auto: no usable GPU {} on this machine to measure ({})", device,
        count_status != cudaSuccess ? std::string(cudaGetErrorString(count_status))
                                    : fmt::format("it has {}", n_gpus));
    HSLIDE_CUDA_CHECK(cudaSetDevice(device));
    // A layer of 2^16 random rows scored for 256 samples, their 64 best kept: enough GEMM and
    // merge work (17 M scores a pass) that the rate is the steady one.
    const uint32_t rows = 1u << 16, batch = 256, k = 64, stride = padded_stride(width);
    std::vector<float> host(size_t(rows) * stride, 0.0f);
    rng gen(0x5ca1ab1e);
    for (uint32_t r = 0; r < rows; ++r)
        for (uint32_t i = 0; i < width; ++i) host[size_t(r) * stride + i] = float(gen.normal());
    struct probe_handles {  // released whatever throws below
        cudaStream_t stream = nullptr;
        cublasHandle_t blas = nullptr;
        cudaEvent_t marks[2] = {};
        ~probe_handles() {
            if (stream) cudaStreamSynchronize(stream);
            if (blas) cublas().destroy(blas);
            for (cudaEvent_t e : marks)
                if (e) cudaEventDestroy(e);
            if (stream) cudaStreamDestroy(stream);
        }
    } handles;
    HSLIDE_CUDA_CHECK(cudaStreamCreateWithFlags(&handles.stream, cudaStreamNonBlocking));
    HSLIDE_CUBLAS_CHECK(cublas().create(&handles.blas));
    HSLIDE_CUBLAS_CHECK(cublas().set_stream(handles.blas, handles.stream));
    cudaStream_t stream = handles.stream;
    device_array<float> weights(host.size(), "scoring rate probe"),
        bias(rows, "scoring rate probe"), hidden(size_t(batch) * stride, "scoring rate probe");
    device_array<__nv_bfloat16> weights16, hidden16;
    HSLIDE_CUDA_CHECK(cudaMemcpyAsync(weights.data(), host.data(), host.size() * 4,
                                      cudaMemcpyHostToDevice, stream));
    // The hidden rows: the first `batch` rows, made non-negative as ReLU activations are.
    for (float& x : host) x = std::fabs(x);
    HSLIDE_CUDA_CHECK(cudaMemcpyAsync(hidden.data(), host.data(), size_t(batch) * stride * 4,
                                      cudaMemcpyHostToDevice, stream));
    bias.zero(stream);
    if (bf16) {
        weights16.resize(weights.size(), "scoring rate probe");
        hidden16.resize(hidden.size(), "scoring rate probe");
        to_bf16(weights.data(), weights16.data(), weights.size(), stream);
        to_bf16(hidden.data(), hidden16.data(), hidden.size(), stream);
    }
    const layer_view layer = layer_view::for_scoring(
        weights.data(), bias.data(), bf16 ? weights16.data() : nullptr, rows, width, stride);
    top_k_workspace ws;
    auto pass = [&] {
        score_top_k(layer, hidden.data(), bf16 ? hidden16.data() : nullptr, stride, bf16, batch, k,
                    /*chunk=*/0, handles.blas, ws, stream);
    };
    pass();  // allocations and cuBLAS's first call
    cudaEvent_t* marks = handles.marks;
    HSLIDE_CUDA_CHECK(cudaEventCreate(&marks[0]));
    HSLIDE_CUDA_CHECK(cudaEventCreate(&marks[1]));
    const int passes = 5;
    HSLIDE_CUDA_CHECK(cudaEventRecord(marks[0], stream));
    for (int i = 0; i < passes; ++i) pass();
    HSLIDE_CUDA_CHECK(cudaEventRecord(marks[1], stream));
    HSLIDE_CUDA_CHECK(cudaEventSynchronize(marks[1]));
    float ms = 0;
    HSLIDE_CUDA_CHECK(cudaEventElapsedTime(&ms, marks[0], marks[1]));
    return double(rows) * batch * passes / (std::max(ms, 1e-3f) / 1000.0);
}

}  // namespace hslide::gpu
