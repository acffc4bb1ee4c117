// The CUDA backend's training step (design in gpu_backend_impl.cuh): the batch's upload,
// the output layer's sets (its selection object: LSH or top-k) or its dense products, the
// updates, and the report of the step before.
#include "gpu_backend_impl.cuh"

namespace hslide::gpu {

uint32_t gpu_backend::upload_batch(const batch_view& batch, bool check_labels) {
    const dataset& data = *batch.data;
    const uint32_t b = batch.size;
    uint64_t nnz = 0, n_labels = 0;
    uint32_t max_labels = 0;
    for (uint32_t s = 0; s < b; ++s) {
        const uint32_t point = batch.rows[s];
        const feature_row x = data.features(point);
        const label_row y = data.labels(point);
        for (uint32_t i = 0; i < x.count; ++i)
            HSLIDE_CHECK(x.ids[i] < shape_.layers[0].rows,
                         "{}: point {} has feature {} but the model has {} inputs", data.source,
                         point, x.ids[i], shape_.layers[0].rows);
        if (check_labels)  // ids of the whole layer (a rank's shard holds some of them)
            for (uint32_t i = 0; i < y.count; ++i)
                HSLIDE_CHECK(y.ids[i] < shape_.config.output_dim(),
                             "{}: point {} has label {} but the model has {} outputs", data.source,
                             point, y.ids[i], shape_.config.output_dim());
        nnz += x.count;
        n_labels += y.count;
        max_labels = std::max(max_labels, y.count);
    }
    HSLIDE_CHECK(nnz < (uint64_t{1} << 31) && n_labels < (uint64_t{1} << 31),
                 "a batch of {} points has too many nonzeros for the GPU backend", b);
    // Layout: feature offsets, label offsets (b + 1 each), feature ids, values, label ids.
    const size_t words = 2 * (size_t(b) + 1) + 2 * nnz + n_labels;
    const int slot = next_staging_;
    next_staging_ ^= 1;
    // Its last copy (two batches ago) must be done before it is refilled (an event never
    // recorded counts as done).
    HSLIDE_CUDA_CHECK(cudaEventSynchronize(handles_.staged[slot]));
    pinned_array<uint32_t>& staging = staging_[slot];
    staging.reserve(words, "batch staging");
    uint32_t* f_off = staging.data();
    uint32_t* l_off = f_off + b + 1;
    uint32_t* f_ids = l_off + b + 1;
    float* f_vals = reinterpret_cast<float*>(f_ids + nnz);
    uint32_t* l_ids = f_ids + 2 * nnz;
    f_off[0] = l_off[0] = 0;
    for (uint32_t s = 0; s < b; ++s) {
        const feature_row x = data.features(batch.rows[s]);
        const label_row y = data.labels(batch.rows[s]);
        std::memcpy(f_ids + f_off[s], x.ids, x.count * 4);
        std::memcpy(f_vals + f_off[s], x.values, x.count * 4);
        std::memcpy(l_ids + l_off[s], y.ids, y.count * 4);
        f_off[s + 1] = f_off[s] + x.count;
        l_off[s + 1] = l_off[s] + y.count;
    }
    batch_block_.reserve(words, "batch");
    HSLIDE_CUDA_CHECK(cudaMemcpyAsync(batch_block_.data(), staging.data(), words * 4,
                                      cudaMemcpyHostToDevice, stream_));
    HSLIDE_CUDA_CHECK(cudaEventRecord(handles_.staged[slot], stream_));
    batch_nnz_ = uint32_t(nnz);
    batch_labels_ = uint32_t(n_labels);
    return max_labels;
}

batch_csr gpu_backend::device_batch(uint32_t size) const {
    const uint32_t* base = batch_block_.data();
    const uint32_t* f_ids = base + 2 * (size_t(size) + 1);
    return batch_csr{base,
                     f_ids,
                     reinterpret_cast<const float*>(f_ids + batch_nnz_),
                     base + size + 1,
                     f_ids + 2 * size_t(batch_nnz_),
                     size};
}

void gpu_backend::dense_logits(uint32_t batch, void* logits, cudaDataType_t type, uint32_t ld) {
    const device_layer& out = layers_[1];
    const float one = 1.0f, zero = 0.0f;
    // Row-major logits (batch rows of ld values) are column-major (rows x batch, leading
    // dimension ld) = W . hidden^T; columns rows..ld - 1 are not written.
    if (use_bf16()) {
        HSLIDE_CUBLAS_CHECK(cublas().gemm_ex(
            blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(out.rows), int(batch), int(out.width), &one,
            out.weights16.data(), CUDA_R_16BF, int(out.stride), hidden16_.data(), CUDA_R_16BF,
            int(layers_[0].stride), &zero, logits, type, int(ld), CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT));
    } else {
        HSLIDE_ASSERT(type == CUDA_R_32F);
        HSLIDE_CUBLAS_CHECK(cublas().sgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(out.rows),
                                           int(batch), int(out.width), &one, out.weights.data(),
                                           int(out.stride), hidden_.data(), int(layers_[0].stride),
                                           &zero, static_cast<float*>(logits), int(ld)));
    }
}

void gpu_backend::dense_loss(uint32_t batch, const batch_csr& csr, float inv_batch) {
    const device_layer& out = layers_[1];
    const uint32_t ld = dense_leading_dimension(out.rows);
    // The gradient in the precision of the logits, which the backward products consume; the
    // bias gradient with it.
    bias_gradient_.reserve(out.rows, "dense output gradient");
    dense_softmax_work_.reserve(dense_softmax_work_floats(batch, out.rows), "dense softmax");
    auto run = [&](const auto* logits, auto* delta) {
        using T = std::remove_pointer_t<decltype(delta)>;  // float or __nv_bfloat16
        const auto fused_loss =
            train_.loss == output_loss::logistic ? &dense_logistic_loss<T> : &dense_softmax_loss<T>;
        fused_loss(logits, out.bias.data(), out.rows, ld, csr, inv_batch, delta,
                   bias_gradient_.data(), loss_.data(), dense_softmax_work_.data(), stream_);
    };
    if (use_bf16()) {
        delta16_.reserve(size_t(batch) * ld, "bf16 output gradients");
        run(logits16_.data(), delta16_.data());
    } else {
        delta_.reserve(size_t(batch) * ld, "dense output gradients");
        run(logits_.data(), delta_.data());
    }
}

void gpu_backend::dense_backward_and_update(uint32_t batch, float inv_batch,
                                            const adam_params& adam) {
    device_layer& out = layers_[1];
    const float one = 1.0f, zero = 0.0f;
    const int rows = int(out.rows), width = int(out.width), stride = int(out.stride);
    const int hstride = int(layers_[0].stride), b = int(batch);
    const int ld = int(dense_leading_dimension(out.rows));  // of the deltas (dense_loss)
    const size_t value_bytes = use_bf16() ? 2 : 4;          // of the deltas and the weight gradient
    // d_hidden (column-major stride x batch) = W^T . delta; the padding rows stay zero.
    d_hidden_.zero(stream_);
    void* gradient = nullptr;  // dW, column-major stride x rows
    if (use_bf16()) {
        // Mixed precision as AMP training does it: all three products on the tensor cores,
        // the logits and deltas in bf16 (dense_loss wrote them so), and the weight gradient
        // written in bf16 for Adam, as autocast's linear layers produce theirs (half the bytes
        // of an fp32 one, written and read once a step: 2 x 171 MB at Amazon-670K). The CPU's
        // bf16 path keeps logits, deltas and gradients in fp32, so here the two differ by
        // about 2^-9 per term (the dense GPU path is the baseline the sparse paths are timed
        // against, not a reference).
        dense_gradient16_.reserve(size_t(out.rows) * out.stride, "dense output gradient");
        gradient = dense_gradient16_.data();
        HSLIDE_CUBLAS_CHECK(cublas().gemm_ex(
            blas_, CUBLAS_OP_N, CUBLAS_OP_N, width, b, rows, &one, out.weights16.data(),
            CUDA_R_16BF, stride, delta16_.data(), CUDA_R_16BF, ld, &zero, d_hidden_.data(),
            CUDA_R_32F, hstride, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        // dW = hidden^T . delta, scaled to the batch mean.
        HSLIDE_CUBLAS_CHECK(cublas().gemm_ex(
            blas_, CUBLAS_OP_N, CUBLAS_OP_T, width, rows, b, &inv_batch, hidden16_.data(),
            CUDA_R_16BF, hstride, delta16_.data(), CUDA_R_16BF, ld, &zero, gradient, CUDA_R_16BF,
            stride, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        dense_gradient_.reserve(size_t(out.rows) * out.stride, "dense output gradient");
        gradient = dense_gradient_.data();
        HSLIDE_CUBLAS_CHECK(cublas().sgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, width, b, rows, &one,
                                           out.weights.data(), stride, delta_.data(), ld, &zero,
                                           d_hidden_.data(), hstride));
        HSLIDE_CUBLAS_CHECK(cublas().sgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, width, rows, b,
                                           &inv_batch, hidden_.data(), hstride, delta_.data(), ld,
                                           &zero, dense_gradient_.data(), stride));
    }
    relu_backward(hidden_.data(), batch, layers_[0].stride, d_hidden_.data(), stream_);
    if (width != stride)  // the gradient's padding columns were not written: keep them zero
        HSLIDE_CUDA_CHECK(cudaMemset2DAsync(
            static_cast<char*>(gradient) + width * value_bytes, size_t(stride) * value_bytes, 0,
            size_t(stride - width) * value_bytes, size_t(rows), stream_));
    // The bias gradient came with the deltas (dense_loss).
    if (use_bf16())
        dense_adam(out.view(), dense_gradient16_.data(), bias_gradient_.data(), adam, stream_);
    else
        dense_adam(out.view(), dense_gradient_.data(), bias_gradient_.data(), adam, stream_);
}

void gpu_backend::first_layer_update(uint32_t batch, uint32_t nnz, float inv_batch,
                                     const adam_params& adam) {
    const batch_csr csr = device_batch(batch);
    row_groups& g = input_groups_;
    if (nnz > 0) {
        nonzero_keys(csr, g.keys.data(), nonzero_sample_.data(), g.index.data(), stream_);
        g.group(nnz, 32, stream_);
        first_layer_rows_adam(layers_[0].view(), g.unique.data(), g.begin.data(), g.n_unique.data(),
                              nnz, g.order.data(), nonzero_sample_.data(), csr.feature_values,
                              d_hidden_.data(), inv_batch, adam, stream_);
        mark_rows(changed_[0].data(), g.unique.data(), g.n_unique.data(), nnz, stream_);
        // The forward pass brought them up to date at the step before; now at this one.
        if (catches_up_inputs())
            input_catch_up_.stamp(g.unique.data(), g.n_unique.data(), nnz, stream_);
    }
    if (adam_moves_untouched_rows(train_.adam, 0)) {
        // The other rows move with their momentum, as the CPU's input-dense Adam does.
        input_touched_.zero(stream_);
        if (nnz > 0)
            mark_rows(input_touched_.data(), g.unique.data(), g.n_unique.data(), nnz, stream_);
        untouched_rows_adam(layers_[0].view(), input_touched_.data(), adam, stream_);
        all_changed_[0] = true;
    }
    first_layer_bias_adam(layers_[0].view(), d_hidden_.data(), batch, inv_batch, adam, stream_);
}

void gpu_backend::reserve_first_layer_update(uint32_t nnz) {
    input_groups_.reserve(nnz);
    nonzero_sample_.reserve(std::max(nnz, 1u), "gradient grouping");
    if (adam_moves_untouched_rows(train_.adam, 0))
        input_touched_.reserve(layers_[0].rows, "first-layer row flags");
}

uint32_t gpu_backend::forward_first_layer(const batch_view& batch, cudaEvent_t uploaded) {
    ensure_work(batch.size);
    const uint32_t max_labels = upload_batch(batch, /*check_labels=*/true);
    const batch_csr csr = device_batch(batch.size);
    if (uploaded) HSLIDE_CUDA_CHECK(cudaEventRecord(uploaded, stream_));
    if (catches_up_inputs()) {
        // Every row the forward pass reads (unlabelled points' too), as the CPU's forward pass
        // does; counted in the forward time, as there.
        HSLIDE_ASSERT(input_catch_up_.current() == shape_.adam_step);
        input_catch_up_.catch_up_batch(layers_[0].view(), csr.feature_ids, batch_nnz_,
                                       changed_[0].data(), stream_);
    }
    first_layer_forward(layers_[0].view(), csr, hidden_.data(),
                        use_bf16() ? hidden16_.data() : nullptr, stream_);
    return max_labels;
}

gpu_backend::step_adam gpu_backend::adam_for_step(float learning_rate) const {
    const adam_corrections corrections = adam_bias_corrections(train_, shape_.adam_step + 1);
    const adam_params adam{learning_rate,       train_.adam_beta1, train_.adam_beta2,
                           train_.adam_epsilon, corrections.c1,    corrections.c2};
    // Each layer's rate (layer_config::lr_scale).
    step_adam a{adam, adam};
    a.input.lr *= shape_.config.layers[0].lr_scale;
    a.output.lr *= shape_.config.layers[1].lr_scale;
    return a;
}

void gpu_backend::output_rows_update(uint32_t total, float inv_batch, const adam_params& adam,
                                     uint32_t* touched) {
    device_layer& out = layers_[1];
    row_groups& g = output_groups_;
    g.reserve(total);
    if (total == 0) return;
    HSLIDE_CUDA_CHECK(cudaMemcpyAsync(g.keys.data(), active_.ids.data(), size_t(total) * 4,
                                      cudaMemcpyDeviceToDevice, stream_));
    iota(g.index.data(), total, stream_);
    g.group(total, bits_for(out.rows), stream_);
    output_rows_adam(out.view(), g.unique.data(), g.begin.data(), g.n_unique.data(), total,
                     g.order.data(), active_.entry_sample.data(), delta_.data(), hidden_.data(),
                     inv_batch, adam, stream_);
    mark_rows(changed_[1].data(), g.unique.data(), g.n_unique.data(), total, stream_);
    HSLIDE_CUDA_CHECK(
        cudaMemcpyAsync(touched, g.n_unique.data(), 4, cudaMemcpyDeviceToHost, stream_));
}

void gpu_backend::count_step(const adam_params& input_adam) {
    shape_.adam_step += 1;
    if (catches_up_inputs()) {
        input_catch_up_.record_step(input_adam.lr);
        rows_behind_ = true;
    }
}

step_report gpu_backend::train_batch(const batch_view& batch, float learning_rate) {
    HSLIDE_CHECK(batch.size > 0 && batch.data, "empty batch");
    if (shard_.sharded()) return sharded_train_batch(batch, learning_rate);
    activate();
    const drain_on_throw drain(stream_);
    const int parity = step_parity_;
    cudaEvent_t* events = handles_.events[parity];
    const uint32_t b = batch.size;
    HSLIDE_CUDA_CHECK(cudaEventRecord(events[0], stream_));
    const uint32_t max_labels = forward_first_layer(batch, events[1]);
    const batch_csr csr = device_batch(b);
    device_layer& out = layers_[1];
    uint64_t active_entries = uint64_t(b) * out.rows;
    const float inv_batch = 1.0f / float(b);
    uint32_t total = 0;
    const float* dropped = nullptr;  // per-sample mass outside the sets, where reported
    if (sparse_output()) {
        HSLIDE_CUDA_CHECK(cudaEventRecord(events[2], stream_));
        // The selection's sets (labels first); events[3] once the samples are hashed (top-k:
        // at once, its scoring counts as active sets).
        selection_batch sb;
        sb.layer = out.view();
        sb.size = b;
        sb.csr = &csr;
        sb.max_labels = max_labels;
        sb.hidden = hidden_.data();
        sb.hidden16 = use_bf16() ? hidden16_.data() : nullptr;
        sb.hidden_stride = layers_[0].stride;
        sb.training = true;
        sb.sample_seed = step_seed(train_.seed, seed_stream::train_sample, shape_.adam_step);
        sb.fill_pool_seed = step_seed(train_.seed, seed_stream::fill_pool, shape_.adam_step);
        sb.hashed = events[3];
        total = selection_->select_sets(sb, active_, stream_);
        active_entries = total;
        HSLIDE_CUDA_CHECK(cudaEventRecord(events[4], stream_));
        logits_.reserve(std::max(total, 1u), "active logits");
        delta_.reserve(std::max(total, 1u), "active gradients");
        sparse_output_forward(out.view(), hidden_.data(), hidden16_.data(), use_bf16(),
                              active_.ids.data(), active_.entry_sample.data(), total,
                              logits_.data(), stream_);
        if (train_.loss == output_loss::logistic) {
            // Each member's own binary cross-entropy: no softmax to correct or to report.
            logistic_loss(logits_.data(), nullptr, active_.offsets.data(), 0,
                          /*labels_first=*/true, csr, delta_.data(), loss_.data(), stream_);
        } else {
            // The gradient is the softmax over the set, over the logits the selection gives
            // it (top-k: its fill's correction); the loss reported may be the selection's
            // (top-k: the full softmax's).
            float* set_logits = selection_->set_logits(logits_.data(), active_, b, total, stream_);
            softmax_loss(set_logits, nullptr, active_.offsets.data(), 0,
                         /*labels_first=*/true, csr, delta_.data(), loss_.data(), stream_);
            dropped = selection_->report_loss(logits_.data(), active_, csr, loss_.data(), stream_);
        }
        HSLIDE_CUDA_CHECK(cudaEventRecord(events[5], stream_));
        sparse_output_backward(out.view(), use_bf16(), active_.offsets.data(), active_.ids.data(),
                               delta_.data(), hidden_.data(), b, d_hidden_.data(), stream_);
    } else {
        for (int e = 2; e <= 4; ++e) HSLIDE_CUDA_CHECK(cudaEventRecord(events[e], stream_));
        const uint32_t ld = dense_leading_dimension(out.rows);
        if (use_bf16()) {
            logits16_.reserve(size_t(b) * ld, "dense bf16 logits");
            dense_logits(b, logits16_.data(), CUDA_R_16BF, ld);
        } else {
            logits_.reserve(size_t(b) * ld, "dense logits");
            dense_logits(b, logits_.data(), CUDA_R_32F, ld);
        }
        dense_loss(b, csr, inv_batch);
        HSLIDE_CUDA_CHECK(cudaEventRecord(events[5], stream_));
    }

    // The step counts once its update is queued (an error before leaves the count as it was).
    reserve_first_layer_update(batch_nnz_);
    loss_host_[parity].reserve(b, "losses");
    if (dropped) dropped_host_[parity].reserve(b, "dropped mass");
    const step_adam adam = adam_for_step(learning_rate);
    touched_host_[parity].reserve(1, "touched rows");
    touched_host_[parity].data()[0] = 0;  // read two steps ago at the latest, as the losses
    if (sparse_output()) {
        HSLIDE_CUDA_CHECK(cudaEventRecord(events[6], stream_));
        output_rows_update(total, inv_batch, adam.output, touched_host_[parity].data());
    } else {
        dense_backward_and_update(b, inv_batch, adam.output);  // backward and update in one
        all_changed_[1] = true;
        HSLIDE_CUDA_CHECK(cudaEventRecord(events[6], stream_));
    }
    first_layer_update(b, batch_nnz_, inv_batch, adam.input);
    count_step(adam.input);
    // This parity's loss block was last read two steps ago (its report is taken).
    HSLIDE_CUDA_CHECK(cudaMemcpyAsync(loss_host_[parity].data(), loss_.data(), size_t(b) * 4,
                                      cudaMemcpyDeviceToHost, stream_));
    if (dropped)
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(dropped_host_[parity].data(), dropped, size_t(b) * 4,
                                          cudaMemcpyDeviceToHost, stream_));
    HSLIDE_CUDA_CHECK(cudaEventRecord(events[7], stream_));
    // A refresh asked for while one ran starts now, from this step's weights, beside the
    // host's staging of the next batch.
    if (selection_) selection_->step_queued(out.view());
    // The step before is done (in the LSH path the wait for the set sizes came after it), or
    // finishes while this one is queued: its report goes back now, and this step runs on
    // while the caller prepares the next batch.
    step_report report = finish_pending_step();
    if (selection_) report.times.rebuild += selection_->take_refresh_seconds(false);
    uint32_t labelled = 0;
    for (uint32_t s = 0; s < b; ++s) labelled += batch.data->labels(batch.rows[s]).count > 0;
    pending_ = pending_step{
        true, parity, b, active_entries, labelled, dropped != nullptr, !sparse_output()};
    last_batch_ = b;
    step_parity_ ^= 1;
    return report;
}

step_report gpu_backend::finish_pending_step() {
    step_report report;
    if (!pending_.active) return report;
    pending_.active = false;  // an error below is reported once
    cudaEvent_t* events = handles_.events[pending_.parity];
    HSLIDE_CUDA_CHECK(cudaEventSynchronize(events[7]));
    const uint32_t b = pending_.samples;
    report.samples = b;
    const float* loss = loss_host_[pending_.parity].data();
    for (uint32_t s = 0; s < b; ++s) report.loss_sum += loss[s];
    if (pending_.dropped) {
        // Unlabelled samples have 0 there and are not counted.
        const float* dropped = dropped_host_[pending_.parity].data();
        for (uint32_t s = 0; s < b; ++s) report.dropped_mass_sum += dropped[s];
        report.full_softmax_samples = pending_.labelled;
    }
    report.active_per_layer = {uint64_t(b) * layers_[0].width, pending_.active_entries};
    const double out_rows = double(layers_[1].rows);
    report.output_touched_share_sum =
        pending_.every_row ? 1.0 : touched_host_[pending_.parity].data()[0] / out_rows;
    report.steps_counted = 1;
    auto elapsed = [&](int from, int to) {
        float ms = 0;
        HSLIDE_CUDA_CHECK(cudaEventElapsedTime(&ms, events[from], events[to]));
        return double(ms) / 1000.0;
    };
    // GPU time between the step's marks: waits for the host (staging the batch while the GPU
    // was idle, reading the set sizes) fall into the stage they interrupt.
    stage_times& st = report.times;
    st.transfer = elapsed(0, 1);
    st.forward = elapsed(1, 2) + elapsed(4, 5);
    st.hashing = elapsed(2, 3);
    st.active_sets = elapsed(3, 4);
    st.backward = elapsed(5, 6);
    st.update = elapsed(6, 7);
    report.seconds = elapsed(0, 7);
    return report;
}

step_report gpu_backend::synchronize() {
    activate();
    step_report report = finish_pending_step();
    if (shard_.sharded()) check_replicas();
    // A refresh is not a batch: one still running goes on (finish_table_rebuild waits).
    if (selection_) report.times.rebuild += selection_->take_refresh_seconds(true);
    return report;
}

}  // namespace hslide::gpu
