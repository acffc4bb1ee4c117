"""hslide: LSH-sparse training of extreme multi-label classifiers, from Python.

    import hslide
    X, Y = hslide.read_xc("Bibtex_data.txt")          # scipy.sparse CSR matrices
    model = hslide.Model(hidden=128, epochs=5, seed=1)  # the options of `hslide train`
    model.fit(X[train], Y[train])
    print(model.evaluate(X[test], Y[test]))            # {'p@1': ..., 'ndcg@1': ..., ...}

Features are a scipy.sparse CSR matrix (float32 or float64; other sparse formats are
converted); labels a CSR label-indicator matrix (its nonzero entries) or a list of label
lists. Errors of the library are hslide.Error subclasses: InvalidArgumentError (a ValueError),
IOError (an OSError), OutOfMemoryError (a MemoryError, saying what needed how many bytes) and
RuntimeError (a RuntimeError), carrying the library's message; a
missing file is a FileNotFoundError.
"""

import errno as _errno
import os as _os

import numpy as _np
import scipy.sparse as _sp

from . import _core
from ._core import (Error, InvalidArgumentError, IOError, OutOfMemoryError,  # noqa: A004
                    RuntimeError)

__all__ = ["Model", "load", "read_xc", "write_xc", "read_split", "synthetic", "option_names", "Error",
           "InvalidArgumentError", "IOError", "OutOfMemoryError", "RuntimeError"]


def _existing(path):
    path = _os.fspath(path)
    if not _os.path.exists(path):
        raise FileNotFoundError(_errno.ENOENT, "No such file or directory", path)
    return path


def _python_scalar(value):
    """A numpy scalar as the Python number it holds (np.int64(3) is an int option's 3)."""
    return value.item() if isinstance(value, _np.generic) else value


def _count(value, name, low=1, high=2**32 - 1):
    """A whole number (an int, or a numpy integer) in [low, high], never a float truncated or
    a bool; out of range an InvalidArgumentError naming it (not pybind11's bare TypeError)."""
    if isinstance(value, (bool, _np.bool_)) or not isinstance(value, (int, _np.integer)):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be in [{low}, {high}], got {value}")
    return int(value)


def option_names():
    """The names hslide.Model takes (the `hslide train` flags, '-' written '_')."""
    return list(_core.option_names())


def _features(X, name="X"):
    if not _sp.issparse(X):
        raise TypeError(f"{name} must be a scipy.sparse matrix (CSR), got {type(X).__name__}")
    if X.dtype not in (_np.float32, _np.float64):
        raise TypeError(f"{name} must hold float32 or float64 values, got {X.dtype}")
    X = _sp.csr_matrix(X)  # a copy where it converts; sorted, merged indices below
    try:  # scipy's own sorting reads through indptr: a forged one must not get that far
        X.check_format(full_check=True)
    except ValueError as e:
        raise InvalidArgumentError(f"{name}: malformed CSR matrix: {e}") from None
    if not X.has_sorted_indices or not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()
        X.sort_indices()
    return X


def _label_arrays(Y, n_rows, name="Y", rows_name="X"):
    """(indptr, ids, n_labels) of labels given as a CSR indicator matrix or label lists."""
    if _sp.issparse(Y):
        Y = _sp.csr_matrix(Y)
        try:  # scipy reads through indptr as it merges: a forged one must not get that far
            Y.check_format(full_check=True)
        except ValueError as e:
            raise InvalidArgumentError(f"{name}: malformed CSR matrix: {e}") from None
        if Y.shape[0] != n_rows:
            raise ValueError(f"{rows_name} has {n_rows} rows but {name} has {Y.shape[0]}")
        Y = Y.copy()
        Y.eliminate_zeros()
        Y.sum_duplicates()
        return Y.indptr.astype(_np.int64), Y.indices.astype(_np.uint32), Y.shape[1]
    if isinstance(Y, _np.ndarray):
        raise TypeError(f"{name} must be a scipy.sparse indicator matrix or a list of label "
                        "lists, not a dense array")
    try:
        rows = [list(r) for r in Y]
    except TypeError:
        raise TypeError(f"{name} must be a scipy.sparse indicator matrix or a list of label "
                        f"lists, got {type(Y).__name__}") from None
    if len(rows) != n_rows:
        raise ValueError(f"{rows_name} has {n_rows} rows but {name} has {len(rows)}")
    lengths = _np.fromiter((len(r) for r in rows), dtype=_np.int64, count=len(rows))
    indptr = _np.zeros(len(rows) + 1, dtype=_np.int64)
    _np.cumsum(lengths, out=indptr[1:])
    flat = [i for r in rows for i in r]
    ids = _np.asarray(flat) if flat else _np.zeros(0, dtype=_np.int64)
    if ids.dtype.kind not in "iuf" or (ids.dtype.kind == "f" and not _np.all(_np.isfinite(ids))):
        raise ValueError(f"{name}: label ids must be whole numbers, got {ids.dtype} values")
    if ids.dtype.kind == "f":  # 3.0 is label 3; 1.7 is no label id (astype would truncate it)
        whole = ids == _np.floor(ids)
        if not whole.all():
            row = int(_np.searchsorted(indptr, int(_np.argmin(whole)), side="right")) - 1
            raise ValueError(f"{name}: label id {ids[~whole][0]!r} in row {row} is not a whole "
                             "number")
    if ids.size and (ids.min() < 0 or ids.max() >= 2**32 - 1):
        raise ValueError(f"{name}: label ids must be in [0, 2^32-1)")
    ids = ids.astype(_np.int64)
    n_labels = int(ids.max()) + 1 if ids.size else 0
    return indptr, ids.astype(_np.uint32), n_labels


def _dataset(X, Y=None, name="X", n_labels=0):
    X = _features(X, name)
    if Y is None:
        indptr, ids, labels = _np.zeros(X.shape[0] + 1, dtype=_np.int64), _np.zeros(0, _np.uint32), 0
    else:
        indptr, ids, labels = _label_arrays(Y, X.shape[0], "Y" + name[1:], name)
    return _core.make_dataset(X.indptr.astype(_np.int64), X.indices.astype(_np.uint32),
                              X.data.astype(_np.float32), X.shape[1], indptr, ids,
                              max(labels, n_labels), name)


def _matrices(d):
    indptr, indices, data, label_indptr, label_ids = d.arrays()
    X = _sp.csr_matrix((data, indices.astype(_np.int32), indptr), shape=(d.size, d.n_features))
    Y = _sp.csr_matrix((_np.ones(label_ids.size, dtype=_np.float32),
                        label_ids.astype(_np.int32), label_indptr),
                       shape=(d.size, d.n_labels))
    return X, Y


class Model:
    """A network trained by hslide's shared trainer.

    Options are the `hslide train` flags with '_' for '-' and the same defaults, from the one
    table of options the command line is made from: hidden, backend, K, L, output_sparsity,
    top_k, min_active, lr, batch_size, epochs, threads, seed, scoring, keep_best ('p@1',
    'ndcg@3', ...), patience, valid_fraction, ... (hslide.option_names() lists them); also
    progress (False) and log_level ('warn'). An unknown name is a TypeError with the message
    `hslide train` gives for the flag (naming the nearest options).
    """

    def __init__(self, **options):
        self._options = {name: _python_scalar(value) for name, value in options.items()}
        self._core = _core.Model(self._options)
        self.history_ = []

    def fit(self, X, Y, *, X_valid=None, Y_valid=None, epochs=None, callback=None):
        """Trains a fresh model on (X, Y). epochs: None (the model's option, 'auto' by
        default), 'auto' or a count. 'auto' scores each epoch on a validation set (X_valid/
        Y_valid, the valid_fraction option, else 5% of X held out, at most 2,000 rows), stops
        once it has not improved for `patience` (2) epochs (at most 30) and keeps the best
        epoch's model; a count trains exactly that many epochs on all of X. With a validation
        set, keep_best and patience act on it. callback(record) gets each epoch's record (the --metrics-out line as a dict);
        returning False or raising StopIteration stops training after that epoch.
        Returns self; self.history_ holds the records."""
        if (X_valid is None) != (Y_valid is None):
            raise ValueError("give both X_valid and Y_valid, or neither")
        train = _dataset(X, Y, "X")
        valid = None
        if X_valid is not None:
            valid = _dataset(X_valid, Y_valid, "X_valid")
            if valid.n_features != train.n_features:
                raise ValueError(f"X has {train.n_features} features but X_valid has "
                                 f"{valid.n_features}")
        # The records are kept as they come: a fit that ends by an exception (Ctrl-C, a
        # callback's error) once it has dropped the model before it leaves the model of its
        # own epochs, and history_ says which; one refused before that leaves both as they were.
        records = []

        def collect(record):
            records.append(record)
            return None if callback is None else callback(record)

        begun = self._core.fits_begun
        try:
            self._core.fit(train, valid, _python_scalar(epochs), collect)
        finally:
            if self._core.fits_begun != begun:
                self.history_ = records
        return self

    def predict(self, X, k=5):
        """The top-k labels of every row of X, best first: (labels int64 [n, k], scores
        float32 [n, k]); fewer than k scored labels are padded with -1 / -inf."""
        return self._core.predict(_dataset(X), _count(k, "k"))

    def evaluate(self, X, Y, k=5):
        """P@i, nDCG@i and PSP@i for i = 1..k (PSP from the training label counts), by the code
        `hslide eval` runs; 'points': how many rows were scored."""
        if Y is None:
            raise TypeError("evaluate needs the labels Y of X (predict scores without them)")
        return dict(self._core.evaluate(_dataset(X, Y, n_labels=0), _count(k, "k")))

    def save(self, path):
        """Writes the model as an `hslide train --save` checkpoint (`hslide eval --model`)."""
        self._core.save(_os.fspath(path))

    @property
    def n_features(self):
        return self._core.n_features

    @property
    def n_labels(self):
        return self._core.n_labels

    @property
    def best_epoch(self):
        """The epoch best on the validation set (0 without one)."""
        return self._core.best_epoch

    @property
    def epochs_done(self):
        return self._core.epochs_done


def load(path, **options):
    """A model from a checkpoint (`hslide train --save`, or Model.save). Options as Model's
    (backend, threads, scoring, ...) say how it predicts."""
    m = Model.__new__(Model)
    m._options = {name: _python_scalar(value) for name, value in options.items()}
    m._core = _core.Model.load(_existing(path), m._options)
    m.history_ = []
    return m


def read_xc(path):
    """(X, Y) of an XC-format file: features (float32 CSR) and a label-indicator CSR matrix."""
    return _matrices(_core.read_xc(_existing(path)))


def synthetic(preset="amazon670k", scale=0.05, labels=0, features=0, seed=2024):
    """(X_train, Y_train, X_test, Y_test) from the built-in generator: what `hslide train`
    trains on without --train (--preset, --scale, --labels, --features, --data-seed)."""
    train, test = _core.synthetic(preset, float(scale), int(labels), int(features), int(seed))
    return _matrices(train) + _matrices(test)


def read_split(path, n_points, column=1):
    """0-based rows of column `column` (1-based) of an XC split file, as a numpy array."""
    return _np.asarray(_core.read_split(_existing(path), _count(column, "column", high=2**31 - 1),
                                        _count(n_points, "n_points", low=0, high=2**63 - 1)),
                       dtype=_np.int64)


def write_xc(path, X, Y):
    """Writes (X, Y) as an XC-format file (`N D L` header, then `labels f:v ...` per row)."""
    _core.write_xc(_dataset(X, Y, "X"), _os.fspath(path))
