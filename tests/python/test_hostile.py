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


def many_labels(n, labels, features, density):
    """n rows of one random label each; the largest label, which sets the layer's size, on
    the first."""
    rng = np.random.default_rng(0)
    X = sp.random(n, features, density=density, format="csr", dtype=np.float32, random_state=1)
    Y = [[int(v)] for v in rng.integers(0, labels, n)]
    Y[0] = [labels - 1]
    return X, Y


def fit_interrupted(model, X, Y, after=0.5):
    """model.fit(X, Y) with a SIGINT `after` seconds in: it must end in KeyboardInterrupt."""
    import _thread
    import threading

    timer = threading.Timer(after, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            model.fit(X, Y)
    finally:
        timer.cancel()


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
        # The table's range [0, 1] first (as on the command line), then (0, 1).
        with pytest.raises(hslide.InvalidArgumentError,
                           match="validation fraction|option 'valid_fraction': must be"):
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
    import time

    X, Y = many_labels(30000, 50000, 1000, 0.01)
    model = hslide.Model(hidden=256, epochs=1, output_sparsity="dense", threads=2, seed=1)
    start = time.monotonic()
    fit_interrupted(model, X, Y)
    assert time.monotonic() - start < 8.0


def test_a_malformed_label_matrix_is_refused_not_a_crash():
    # scipy merged a forged Y through its indptr before anything checked it: a double free.
    X, _ = small()
    Y = sp.csr_matrix(np.eye(40, 5, dtype=np.float32))
    Y.indptr[5] = 10**6
    with pytest.raises(hslide.InvalidArgumentError, match="Y: malformed CSR"):
        hslide.Model(**FAST).fit(X, Y)
    Y = sp.csr_matrix(np.eye(40, 5, dtype=np.float32))
    Y.indices[0] = -1
    with pytest.raises(hslide.InvalidArgumentError, match="Y: malformed CSR"):
        hslide.Model(**FAST).fit(X, Y)


def test_a_model_is_used_by_one_thread_and_never_refitted_from_its_own_callback():
    import threading

    X, Y = small()
    model = hslide.Model(**FAST)
    # A fit from its callback would replace the backend the running fit trains: refused, and
    # the error ends the fit. Predicting from the callback is the callback's to do.
    seen = []

    def callback(record):
        seen.append(model.predict(X[:3], 2)[0].shape)
        model.fit(X, Y)

    with pytest.raises(hslide.InvalidArgumentError, match="called from a callback"):
        model.fit(X, Y, callback=callback)
    assert seen == [(3, 2)]
    # Another thread's call while a fit runs is refused; the fit goes on to its end.
    started, errors = threading.Event(), []

    def slow(record):
        started.set()
        threading.Event().wait(0.3)  # the fit holds the model meanwhile

    def other():
        started.wait(10)
        try:
            model.predict(X[:3], 2)
        except hslide.InvalidArgumentError as e:
            errors.append(str(e))

    thread = threading.Thread(target=other)
    thread.start()
    model.fit(X, Y, callback=slow)
    thread.join()
    assert errors and "in use by another thread" in errors[0]
    assert model.predict(X[:3], 2)[0].shape == (3, 2)  # free again once the fit returned


def test_an_interrupted_refit_leaves_a_model_whose_counts_match_it(tmp_path):
    # Ctrl-C in a refit on more labels left the new network with the old run's counts: its
    # evaluation failed and its checkpoint would not load.
    labels = 20000
    X, Y = many_labels(20000, labels, 500, 0.02)
    model = hslide.Model(hidden=64, epochs=3, output_sparsity="dense", threads=2, seed=1)
    model.fit(X[:400], [[i % 8] for i in range(400)])
    fit_interrupted(model, X, Y)
    assert model.n_labels == labels
    assert model.epochs_done == 0
    assert model.evaluate(X[:50], Y[:50])["points"] == 50
    model.save(tmp_path / "m.ckpt")
    assert hslide.load(tmp_path / "m.ckpt").n_labels == labels


@pytest.mark.parametrize("option, value, message", [
    ("output_lr_scale", float("nan"), "must be a finite number"),
    ("lr_drops", -2, "must be from -1 to"),
    ("epochs_per_drop", -7, "must be from -1 to"),
    ("L", 100000, "must be from 1 to 4096"),
    ("valid_fraction", float("nan"), "must be a finite number"),
])
def test_model_options_are_checked_as_the_command_line_checks_them(option, value, message):
    with pytest.raises(hslide.InvalidArgumentError, match=f"option '{option}': {message}"):
        hslide.Model(**{option: value})


def test_threads_zero_is_the_whole_machine_after_a_model_of_one_thread():
    X, Y = small()
    hslide.Model(**dict(FAST, threads=1)).fit(X, Y)
    import os

    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: threads=0 and threads=1 are the same")
    counts = []
    hslide.Model(**dict(FAST, threads=0)).fit(
        X, Y, callback=lambda r: counts.append(r.get("threads")))
    # The epoch record names the process's OpenMP team: the machine's, not the last model's.
    assert counts and all(c == os.cpu_count() or (c or 0) > 1 for c in counts), counts


def test_evaluate_needs_labels_and_points_and_write_xc_a_line_for_every_point(tmp_path):
    X, Y = small()
    model = hslide.Model(**FAST).fit(X, Y)
    with pytest.raises(TypeError, match="evaluate needs the labels Y"):
        model.evaluate(X, None)
    with pytest.raises(hslide.InvalidArgumentError, match="no rows to evaluate"):
        model.evaluate(X[:0], [])
    with pytest.raises(hslide.InvalidArgumentError, match="point 0 has no labels and no features"):
        hslide.write_xc(tmp_path / "d.txt", sp.csr_matrix((3, 5), dtype=np.float32), [[], [1], []])
    assert not (tmp_path / "d.txt").exists()


def test_numpy_scalars_are_numbers_and_bools_or_floats_are_no_counts():
    X, Y = small()
    model = hslide.Model(**dict(FAST, epochs=np.int64(1), hidden=np.int64(16))).fit(
        X, Y, epochs=np.int64(1))
    assert model.epochs_done == 1
    assert model.predict(X[:2], np.int64(3))[0].shape == (2, 3)
    for k in (2.7, True):
        with pytest.raises(TypeError, match="k must be an int"):
            model.predict(X[:2], k)
    # Out of the core's range: a message naming the argument, not pybind11's bare TypeError.
    for k in (-1, 0, 2**40):
        with pytest.raises(hslide.InvalidArgumentError, match=rf"k must be in \[1, 4294967295\], got {k}"):
            model.predict(X[:2], k)
        with pytest.raises(hslide.InvalidArgumentError, match="k must be in"):
            model.evaluate(X[:2], Y[:2], k)
    for options in ({"hidden": True}, {"hidden": [64, True]}, {"lr": True}):
        with pytest.raises(TypeError, match="wrong type"):
            hslide.Model(**options)
    with pytest.raises(TypeError, match="option 'top-k' is spelt 'top_k' in Python"):
        hslide.Model(**{"top-k": 8})
    with pytest.raises(ValueError, match="X_valid has 10 rows but Y_valid has 3"):
        hslide.Model(**FAST).fit(X, Y, X_valid=X[:10], Y_valid=Y[:3])


def test_read_split_names_an_argument_out_of_range(tmp_path):
    split = tmp_path / "split.txt"
    split.write_text("1\n3\n")
    assert list(hslide.read_split(split, 4)) == [0, 2]
    with pytest.raises(hslide.InvalidArgumentError, match=r"n_points must be in \[0, .*\], got -1"):
        hslide.read_split(split, -1)
    with pytest.raises(hslide.InvalidArgumentError, match=r"column must be in \[1, 2147483647\], got 0"):
        hslide.read_split(split, 4, column=0)


def test_a_fit_ended_by_an_exception_leaves_the_history_of_its_own_epochs():
    X, Y = small()
    model = hslide.Model(**FAST).fit(X, Y, epochs=3)
    assert [r["epoch"] for r in model.history_] == [1, 2, 3]

    def fail_after_two(record):
        if record["epoch"] == 2:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        model.fit(X, Y, epochs=5, callback=fail_after_two)
    # The model is the interrupted run's (two epochs), and so is its history, not the last
    # complete fit's three.
    assert model.epochs_done == 2
    assert [r["epoch"] for r in model.history_] == [1, 2]
    # A fit refused before it starts leaves the model and its history as they were.
    held_out = hslide.Model(**dict(FAST, valid_fraction=0.2)).fit(X, Y, epochs=2)
    with pytest.raises(hslide.InvalidArgumentError, match="not both"):
        held_out.fit(X, Y, epochs=3, X_valid=X[:5], Y_valid=Y[:5])
    assert [r["epoch"] for r in held_out.history_] == [1, 2]
    assert held_out.predict(X[:2], 1)[0].shape == (2, 1)
