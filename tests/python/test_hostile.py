"""Hostile input through the Python API (issue 31): what used to crash the interpreter or be
accepted silently is refused with hslide's errors, and nothing is left behind."""

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import FAST, hslide


def small():
    X = sp.random(40, 30, density=0.2, format="csr", dtype=np.float32, random_state=0)
    Y = [[i % 5] for i in range(40)]
    return X, Y


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features_are_refused(bad):
    X, Y = small()
    X.data[3] = bad
    with pytest.raises(hslide.InvalidArgumentError, match="NaN or infinite"):
        hslide.Model(**FAST).fit(X, Y)


def test_malformed_csr_is_refused_not_a_crash():
    X, Y = small()
    X.indptr[5] = 10**6  # past nnz: reading through it would leave the arrays
    with pytest.raises(hslide.InvalidArgumentError, match="malformed CSR"):
        hslide.Model(**FAST).fit(X, Y)
    with pytest.raises(hslide.InvalidArgumentError, match="past its"):
        hslide._core.make_dataset(X.indptr.astype(np.int64), X.indices.astype(np.uint32),
                                  X.data, 30, np.arange(41, dtype=np.int64),
                                  np.zeros(40, np.uint32), 5, "X")


def test_thread_counts_beyond_the_machine_are_refused():
    with pytest.raises(hslide.InvalidArgumentError, match="100000 is more than"):
        hslide.Model(threads=100000)


@pytest.mark.parametrize("option", [dict(epochs=2**40), dict(epochs=-1), dict(seed=2**64)])
def test_integers_out_of_range_are_range_errors_not_type_errors(option):
    (name, value), = option.items()
    with pytest.raises(hslide.InvalidArgumentError,
                       match=f"option '{name}': {value} is out of its range"):
        hslide.Model(**option)


def test_fractional_label_ids_are_refused():
    X, Y = small()
    with pytest.raises(ValueError, match="1.7 in row 0 is not a whole number"):
        hslide.Model(**FAST).fit(X, [[1.7]] + Y[1:])
    hslide.Model(**FAST).fit(X, [[3.0]] + Y[1:])  # a whole number is a label id


def test_validation_fraction_out_of_range_is_refused():
    for bad in (-0.5, 1.0, 2.0, float("nan")):
        with pytest.raises(hslide.InvalidArgumentError, match="validation fraction"):
            hslide.Model(valid_fraction=bad)


def test_write_xc_refuses_nan_and_writes_nothing(tmp_path):
    X, Y = small()
    X.data[0] = np.nan
    with pytest.raises(hslide.InvalidArgumentError, match="NaN or infinite"):
        hslide.write_xc(tmp_path / "x.txt", X, Y)
    assert list(tmp_path.iterdir()) == []


def test_callback_returning_an_empty_list_stops_like_false():
    X, Y = small()
    model = hslide.Model(**{**FAST, "epochs": 3}).fit(X, Y, callback=lambda record: [])
    assert model.epochs_done == 1


def test_fifo_as_model_is_refused_not_a_hang(tmp_path):
    import os
    fifo = tmp_path / "model.ck"
    os.mkfifo(fifo)
    with pytest.raises(hslide.InvalidArgumentError, match="not a regular file"):
        hslide.load(fifo)


def test_ctrl_c_stops_fit_within_a_step_not_at_the_epochs_end():
    # One epoch of ~240 steps over a dense 50,000-label output layer takes tens of seconds on
    # 2 cores; a SIGINT half a second in must end fit() with KeyboardInterrupt within a step
    # or two (it used to wait for the end of the epoch).
    import _thread
    import threading
    import time

    rng = np.random.default_rng(0)
    n, labels = 30000, 50000
    X = sp.random(n, 1000, density=0.01, format="csr", dtype=np.float32, random_state=1)
    Y = [[int(v)] for v in rng.integers(0, labels, n)]
    Y[0] = [labels - 1]  # the largest label sets the layer's size
    model = hslide.Model(hidden=256, epochs=1, output_sparsity="dense", threads=2, seed=1)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            model.fit(X, Y)
    finally:
        timer.cancel()
    assert time.monotonic() - start < 8.0
