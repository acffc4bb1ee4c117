"""The Python API (hslide/__init__.py over src/python/module.cpp): training, prediction,
evaluation, checkpoints shared with the CLI, XC files, errors, validation and callbacks."""

import json
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import FAST, hslide


def run_cli(cli, *args):
    result = subprocess.run([cli, *map(str, args)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result


def last_json(path):
    return json.loads(path.read_text().splitlines()[-1])


def test_fit_predict_evaluate_tiny(tiny):
    X, Y, Xt, Yt = tiny
    model = hslide.Model(**FAST).fit(X, Y)
    assert [r["epoch"] for r in model.history_] == [1, 2]
    assert model.n_features == X.shape[1] and model.n_labels == Y.shape[1]
    labels, scores = model.predict(Xt, 5)
    assert labels.shape == scores.shape == (Xt.shape[0], 5)
    assert labels.dtype == np.int64 and scores.dtype == np.float32
    assert (np.diff(scores, axis=1) <= 0).all(), "best first"
    metrics = model.evaluate(Xt, Yt, k=5)
    for name in ("p@1", "p@3", "p@5", "ndcg@5", "psp@5"):
        assert 0 <= metrics[name] <= 1
    assert metrics["points"] == Xt.shape[0]
    # P@1 from predict() agrees with evaluate()'s.
    hits = [labels[i, 0] in Yt.indices[Yt.indptr[i]:Yt.indptr[i + 1]] for i in range(Xt.shape[0])]
    assert metrics["p@1"] == pytest.approx(np.mean(hits))
    assert metrics["p@1"] > 0.1  # it learns (the label prior scores far less)


def test_inputs_convert(tiny):
    """float64 features, other sparse formats and label lists train the same model."""
    X, Y, Xt, _ = tiny
    a = hslide.Model(**FAST).fit(X, Y).predict(Xt, 3)
    lists = [list(Y.indices[Y.indptr[i]:Y.indptr[i + 1]]) for i in range(Y.shape[0])]
    b = hslide.Model(**FAST).fit(X.astype(np.float64).tocoo(), lists).predict(Xt, 3)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_allclose(a[1], b[1], rtol=1e-6)


def test_bad_inputs(tiny):
    X, Y, Xt, Yt = tiny
    with pytest.raises(TypeError, match="unknown option 'hiden'"):
        hslide.Model(hiden=64)
    with pytest.raises(ValueError, match="--epochs \\(epochs\\) must be 'auto' or a positive"):
        hslide.Model(epochs="many")
    with pytest.raises(ValueError, match="epochs"):
        hslide.Model(epochs=0)
    with pytest.raises(TypeError, match="'epochs' has the wrong type"):
        hslide.Model(epochs=2.5)
    with pytest.raises(TypeError, match="epochs="):
        hslide.Model(**FAST).fit(X, Y, epochs=2.5)
    with pytest.raises(ValueError, match="adam"):
        hslide.Model(adam="bogus")
    with pytest.raises(ValueError, match="validation metric"):
        hslide.Model(keep_best="p@9")
    model = hslide.Model(**FAST)
    with pytest.raises(TypeError, match="scipy.sparse"):
        model.fit(X.toarray(), Y)
    with pytest.raises(TypeError, match="float32 or float64"):
        model.fit(X.astype(np.int32), Y)
    with pytest.raises(ValueError, match="rows"):
        model.fit(X, Y[:-1])
    with pytest.raises(ValueError, match="rows"):
        model.fit(X, [[0]] * 3)
    with pytest.raises(ValueError, match="label ids"):
        model.fit(X[:2], [[0], [-1]])
    with pytest.raises(ValueError, match="features"):
        model.fit(X, Y, X_valid=Xt[:, :10], Y_valid=Yt)
    with pytest.raises(ValueError, match="validation set"):
        hslide.Model(**FAST, keep_best="p@1").fit(X, Y)
    with pytest.raises(hslide.Error, match="not trained"):
        model.predict(Xt, 5)
    model.fit(X, Y, epochs=1)
    with pytest.raises(hslide.InvalidArgumentError, match="features but the model takes"):
        model.predict(sp.csr_matrix((1, X.shape[1] + 5), dtype=np.float32), 5)
    with pytest.raises(OSError, match="no/such"):
        hslide.read_xc("/no/such/file.txt")
    with pytest.raises(ValueError):
        hslide.load(__file__)  # not a checkpoint


def test_unknown_option_message_is_the_clis(cli):
    """hslide.Model and `hslide train` refuse an unknown option with one message, made from
    the same table (the nearest names spelled as each front end takes them)."""
    for keyword, flag, near in (("hiden", "hiden", "hidden"), ("top_kk", "top-kk", "top_k"),
                                ("deterministic", "deterministic", None)):
        with pytest.raises(TypeError) as caught:
            hslide.Model(**{keyword: 1})
        python = str(caught.value)
        result = subprocess.run([cli, "train", f"--{flag}", "1"], capture_output=True, text=True)
        assert result.returncode == 2
        message = result.stderr.split("error: ", 1)[1].split("; see --help")[0]
        assert message.startswith(f"unknown option '{flag}'"), result.stderr
        assert python == ("hslide.Model: " + message.replace("-", "_") +
                          "; hslide.option_names() lists the options"), (python, message)
        if near:
            assert f"did you mean '{near}'" in python, python
        else:
            assert "did you mean" not in python, python  # --deterministic is gone


def test_option_names_are_the_tables():
    names = hslide.option_names()
    # The network, the run, where it runs: as `hslide train` names them, '_' for '-'.
    for name in ("hidden", "top_k", "top_k_search", "K", "L", "batch_size", "lr", "adam",
                 "adam_moments", "backend", "threads", "precision", "scoring", "keep_best",
                 "patience", "lr_drops", "epochs_per_drop", "min_gain", "valid_fraction",
                 "log_level", "progress"):
        assert name in names, name
    # The command line's own (files, checkpoints, the hybrid, terminal output) are not.
    for name in ("train", "save", "resume", "workers", "quiet", "deterministic"):
        assert name not in names, name
    # Every name is taken, with its default value type.
    hslide.Model(**{"top_k": 8, "hash": ["dwta"], "K": [2], "keep_best": None, "lr": 0.01})


def test_callback_stops_training(tiny):
    X, Y, _, _ = tiny
    seen = []

    def stop_after_two(record):
        seen.append(record)
        return record["epoch"] < 2

    model = hslide.Model(**dict(FAST, epochs=5)).fit(X, Y, callback=stop_after_two)
    assert [r["epoch"] for r in seen] == [1, 2] and model.epochs_done == 2
    assert {"epoch", "loss", "seconds", "samples_per_s", "backend"} <= set(seen[0])

    def stop_iteration(record):
        raise StopIteration

    assert hslide.Model(**dict(FAST, epochs=5)).fit(X, Y, callback=stop_iteration).epochs_done == 1

    def fail(record):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        hslide.Model(**FAST).fit(X, Y, callback=fail)


def test_keep_best_and_patience(tiny):
    """The model kept is the best epoch's on the validation set; patience stops early."""
    X, Y, Xt, Yt = tiny
    # A learning rate high enough to overfit the small training set within a few epochs.
    # scoring exact-bf16: what the hold-out is scored with (under the default, exact, too), so
    # that evaluating the kept model repeats its epoch's figure.
    options = dict(FAST, epochs=8, lr=0.02, keep_best="p@1", patience=2, scoring="exact-bf16")
    model = hslide.Model(**options).fit(X, Y, X_valid=Xt, Y_valid=Yt)
    history = model.history_
    valid = [r["valid"]["p@1"] for r in history]
    best = int(np.argmax(valid)) + 1
    assert model.best_epoch == best == history[-1]["best_epoch"]
    assert history[-1]["valid_metric"] == "p@1"
    if len(history) < 8:
        assert len(history) - best == 2, "stopped after 2 epochs without improvement"
    assert model.evaluate(Xt, Yt)["p@1"] == valid[best - 1]
    # valid_fraction holds out part of the training set instead.
    held = hslide.Model(**dict(FAST, valid_fraction=0.25, keep_best="ndcg@3")).fit(X, Y)
    assert held.history_[0]["valid"]["points"] == round(0.25 * X.shape[0])


def test_epochs_auto(tiny):
    """epochs='auto' (the default) holds out 5% of X, keeps the best epoch and stops on
    patience; a count trains exactly that many epochs on all of X with no validation."""
    X, Y, _, _ = tiny
    options = {k: v for k, v in FAST.items() if k != "epochs"}
    options["lr"] = 0.02  # overfits the small set within a few epochs: auto must stop
    model = hslide.Model(**options).fit(X, Y)
    history = model.history_
    assert all(r["epochs"] == "auto" for r in history)
    assert history[0]["valid"]["points"] == round(0.05 * X.shape[0])
    assert history[0]["valid_metric"] == "ndcg@5"  # auto's default: steadier than P@1
    valid = [r["valid"]["ndcg@5"] for r in history]
    best = model.best_epoch
    assert model.epochs_done == best
    # The kept epoch scored the most, or is the last, the epoch at the dropped rate, within the
    # hold-out's noise (the binomial bound of validation.hpp's holdout_noise) of the most.
    top, points = max(valid), history[0]["valid"]["points"]
    kept = max(i for i, r in enumerate(history) if r["epoch"] == best)
    noise = (top * (1 - top) / points) ** 0.5
    assert valid[kept] == top or (kept == len(history) - 1 and valid[kept] >= top - noise)
    # An epoch without improvement, once answered by going back to the best at a tenth of the
    # rate (that epoch undone and trained again), then the stop.
    assert best + 1 <= len(history) <= best + 2 < 30, "stopped after an epoch without improvement"
    # The keyword of fit() and of the model take 'auto' and counts alike.
    assert len(hslide.Model(**options).fit(X, Y, epochs="auto").history_) == len(history)
    fixed = hslide.Model(**dict(options, epochs="auto")).fit(X, Y, epochs=3)
    assert [r["epoch"] for r in fixed.history_] == [1, 2, 3] and fixed.epochs_done == 3
    assert all("valid" not in r and "epochs" not in r for r in fixed.history_)


def test_xc_round_trip(tiny, tmp_path):
    X, Y, _, _ = tiny
    path = tmp_path / "data.txt"
    hslide.write_xc(path, X, Y)
    X2, Y2 = hslide.read_xc(path)
    assert X2.shape == X.shape and Y2.shape == Y.shape
    assert (X2 != X).nnz == 0 and (Y2 != Y).nnz == 0


def test_checkpoints_across_python_and_cli(tiny, tmp_path, cli):
    X, Y, Xt, Yt = tiny
    train, test = tmp_path / "train.txt", tmp_path / "test.txt"
    hslide.write_xc(train, X, Y)
    hslide.write_xc(test, Xt, Yt)
    # Python -> hslide eval.
    model = hslide.Model(**FAST).fit(X, Y)
    model.save(tmp_path / "py.ckpt")
    run_cli(cli, "eval", "--model", tmp_path / "py.ckpt", "--test", test, "-q", "--no-cache",
            "--metrics-out", tmp_path / "eval.jsonl")
    ours, theirs = model.evaluate(Xt, Yt), last_json(tmp_path / "eval.jsonl")
    for name in ("p@1", "p@3", "p@5", "ndcg@5", "psp@5"):
        assert ours[name] == pytest.approx(theirs[name], abs=1e-12), name
    # hslide train --save -> Python, and a Python save of a loaded model.
    run_cli(cli, "train", "--train", train, "--test", test, "--hidden", 32, "--epochs", 2,
            "--threads", 2, "--seed", 3, "--min-active", 64, "--no-cache",
            "-q", "--save", tmp_path / "cli.ckpt", "--metrics-out", tmp_path / "train.jsonl")
    loaded = hslide.load(tmp_path / "cli.ckpt")
    assert loaded.epochs_done == 2
    final = last_json(tmp_path / "train.jsonl")
    metrics = loaded.evaluate(Xt, Yt)
    assert metrics["p@1"] == pytest.approx(final["p@1"], abs=1e-12)
    assert metrics["psp@3"] == pytest.approx(final["psp@3"], abs=1e-12)
    # The same options and seed train the same model in both.
    assert ours["p@1"] == pytest.approx(final["p@1"], abs=1e-12)


def test_bibtex_same_p1_as_cli(bibtex, tmp_path, cli):
    data, train_split, test_split = bibtex
    X, Y = hslide.read_xc(data)
    train = hslide.read_split(train_split, X.shape[0])
    test = hslide.read_split(test_split, X.shape[0])
    options = dict(hidden=64, epochs=2, threads=2, seed=5)
    model = hslide.Model(**options).fit(X[train], Y[train])
    ours = model.evaluate(X[test], Y[test])
    run_cli(cli, "train", "--train", data, "--train-split", train_split, "--test-split",
            test_split, "--hidden", 64, "--epochs", 2, "--threads", 2, "--seed", 5,
            "--eval-every", 0, "-q", "--metrics-out",
            tmp_path / "bibtex.jsonl")
    theirs = last_json(tmp_path / "bibtex.jsonl")
    assert ours["p@1"] == theirs["p@1"] and ours["p@5"] == theirs["p@5"]
    assert ours["p@1"] > 0.25, ours  # 0.31: it learns


def test_fit_starts_fresh_each_time(tiny):
    """fit(epochs=1) does not change the options: a second fit trains the model's own epochs
    from scratch, the same model as a fresh one."""
    X, Y, Xt, _ = tiny
    model = hslide.Model(**FAST)
    model.fit(X, Y, epochs=1)
    assert model.epochs_done == 1
    model.fit(X, Y)
    assert model.epochs_done == FAST["epochs"]
    np.testing.assert_array_equal(model.predict(Xt, 3)[0],
                                  hslide.Model(**FAST).fit(X, Y).predict(Xt, 3)[0])


def test_ivf_top_k_search_trains_and_is_checked(tiny):
    # --top-k-search ivf and its settings as keyword arguments; probing every cluster (probes
    # above the clusters) is exact top-k, so the model is exact top-k's.
    X, Y, Xt, _ = tiny
    # top_k_search pinned to exact: auto means exact over a bf16 copy on an AMX CPU (its
    # candidates may differ from fp32's in the last bits), which is not the reference here.
    exact = dict(FAST, output_sparsity="topk", top_k=8, top_k_search="exact")
    ivf = dict(exact, top_k_search="ivf", ivf_clusters=4, ivf_probes=64, ivf_refresh=1)
    a = hslide.Model(**exact).fit(X, Y).predict(Xt, 3)
    b = hslide.Model(**ivf).fit(X, Y).predict(Xt, 3)
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()
    with pytest.raises(Exception):
        hslide.Model(**dict(ivf, top_k_search="approximate")).fit(X, Y)
