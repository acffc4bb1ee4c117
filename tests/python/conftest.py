"""Fixtures of the Python API tests: the module (skipped with a message when it was not
built), the `hslide` command, the shared real datasets, and a tiny synthetic dataset."""

import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _import_hslide():
    try:
        import hslide
    except ImportError as e:
        pytest.skip(f"the hslide Python module is not importable ({e}); build it "
                    "(HSLIDE_PYTHON=AUTO|ON) and set PYTHONPATH=build/python",
                    allow_module_level=True)
    return hslide


hslide = _import_hslide()


@pytest.fixture(scope="session")
def cli():
    """The `hslide` command of the same build."""
    path = os.environ.get("HSLIDE_BINARY") or str(REPO / "build" / "hslide")
    if not os.access(path, os.X_OK):
        pytest.skip(f"no hslide command at {path} (set HSLIDE_BINARY)")
    return path


@pytest.fixture(scope="session")
def shared_data():
    """../shared/data (or $HSLIDE_SHARED_DATA), as the C++ tests find it."""
    path = pathlib.Path(os.environ.get("HSLIDE_SHARED_DATA")
                        or os.environ.get("HSLIDE_SHARED_DATA_DIR")
                        or REPO.parent / "shared" / "data")
    return path


@pytest.fixture(scope="session")
def bibtex(shared_data):
    """(path, train rows, test rows) of Bibtex's first split; skipped when absent."""
    d = shared_data / "bibtex"
    data = d / "Bibtex_data.txt"
    if not data.exists():
        pytest.skip(f"Bibtex not found in {d} (set HSLIDE_SHARED_DATA)")
    return data, d / "bibtex_trSplit.txt", d / "bibtex_tstSplit.txt"


@pytest.fixture(scope="session")
def tiny():
    """(X_train, Y_train, X_test, Y_test) of the tiny synthetic preset, 200 labels."""
    return hslide.synthetic("tiny", scale=0.5, labels=200, features=1000, seed=7)


# Small, fast settings shared by the tests (deterministic: the same model every run).
FAST = dict(hidden=32, epochs=2, threads=2, seed=3, min_active=64)
