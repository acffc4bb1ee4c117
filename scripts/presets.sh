# The papers' networks and hyperparameters for each synthetic preset, shared by
# scripts/reproduce.sh and scripts/gpu_check.sh (sourced: `preset_settings NAME` sets p_hidden,
# p_K, p_L, p_bits, p_capacity, p_batch, p_min_active, p_sparsity and p_fill_correction, or
# fails for an unknown name).
#
# SLIDE / G-SLIDE: hidden 128, DWTA; Amazon-670K: K=6, L=50, batch 256; WikiLSHTC-325K: K=5,
# L=350, batch 256. Bits per hash 2: the published code packed each hash into (int)log(8) = 2
# bits (DESIGN.md), so its K=6 tables had 2^12 buckets; that is what --bits 2 reproduces (with
# hslide's default of 3 bits, K=6 gives 2^18 nearly empty buckets and the active set is only the
# random fill).
#
# Bucket capacity: 128 (SLIDE's), except WikiLSHTC-325K's 16. Its K=5 tables have 2^10 buckets
# of about 317 of the 325k neurons each, so 350 full buckets of 128 made a union of 40,000
# neurons a sample (12% of the layer): 77 s an epoch on this project's 2-core VM at --scale
# 0.01, against 19 s with 16 (5,500 neurons), for about the same P@1 per epoch (after 3
# epochs: 0.095 uncapped, 0.086-0.089 with 16; after 6: 0.36 with 16, 0.37 with 128 cut to the
# 4,096 most-hit; bench/synthetic.md), and a union of 350 x 128 does not fit the GPU's
# shared-memory hash sets.
# p_sparsity is the output layer's selection, hslide train's own default: top-k (found by the
# IVF search on a CPU, exactly on a GPU), with each step's random fill drawn from one pool
# (--fill-pool 0.5). On the Amazon-670K shape it learns more per epoch than
# the dense layer and than SLIDE's LSH, with sets of 1,024 neurons (LSH's: ~6,000) and 16% of
# the rows updated a step (LSH's: 90%; bench/topk.md). The K, L, bits and capacity above are
# for the LSH configurations (reproduce.sh's cpu-lsh and gpu-lsh, gpu_check.sh's LSH rows).
# p_fill_correction: Amazon-3M's rare labels need the fill's log-Q correction (1), which the
# others do without (it gives up top-k's lead there; bench/topk.md).
preset_settings() {
    p_sparsity=topk p_capacity=128 p_fill_correction=0
    case $1 in
    amazon670k) p_hidden=128 p_K=6 p_L=50 p_bits=2 p_batch=256 p_min_active=1024 ;;
    wikilshtc325k) p_hidden=128 p_K=5 p_L=350 p_bits=2 p_batch=256 p_min_active=1024 p_capacity=16 ;;
    delicious200k) p_hidden=128 p_K=6 p_L=50 p_bits=2 p_batch=128 p_min_active=1024 ;;
    # No paper setting: K=8 gives 2^16 buckets a table, about 43 of the 2.8M neurons each.
    amazon3m) p_hidden=128 p_K=8 p_L=50 p_bits=2 p_batch=256 p_min_active=1024 p_fill_correction=1 ;;
    # tiny (tests): 500 labels, below the automatic LSH threshold, so LSH is forced.
    tiny) p_hidden=64 p_K=3 p_L=16 p_bits=2 p_batch=64 p_min_active=64 p_sparsity=lsh ;;
    *) return 1 ;;
    esac
}
