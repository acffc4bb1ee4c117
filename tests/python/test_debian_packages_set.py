"""scripts/debian_packages_set.py: a real XC set from a Debian package index, on a small
index written here (the recipe's rules: relations parsed, rare features and labels dropped,
points without a label dropped, the split by name), and `hslide train` reads what it writes."""

import hashlib
import importlib.util
import math
import subprocess

from conftest import REPO

spec = importlib.util.spec_from_file_location("debian_packages_set",
                                              REPO / "scripts" / "debian_packages_set.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


def index_text(n=60):
    stanzas = []
    for i in range(n):
        depends = "libc6 (>= 2.34), libfoo1 | libbar2:any" if i % 2 else "python3:any"
        if i % 7 == 0:
            depends += f", only-me-{i}"  # seen once: dropped as a label
        stanzas.append(f"Package: pkg-{i}\nVersion: 1\nArchitecture: {'amd64' if i % 2 else 'all'}\n"
                       f"Depends: {depends}\nDescription: tool number {i % 5} for word{i}\n"
                       f"Tag: role::program,\n use::{i % 3}\nSection: utils\nPriority: optional\n")
    stanzas.append("Package: no-relations\nDescription: nothing\n")
    return "\n".join(stanzas) + "\n"


def test_the_recipe_on_a_small_index(tmp_path, cli):
    train, test, n_features, n_labels = script.build(index_text(), ["Depends"])
    is_test = {f"pkg-{i}": int(hashlib.md5(f"pkg-{i}".encode()).hexdigest(), 16) % 5 == 0
               for i in range(60)}
    assert len(test) == sum(is_test.values()) and len(train) == 60 - len(test)
    # libc6, libfoo1, libbar2 (alternatives count), python3; "only-me-*" seen once each.
    assert n_labels == 4
    assert all(labels and max(labels) < n_labels for _, labels in train + test)
    # Words seen once ("word17") are dropped; "tool", the section, the tags are kept.
    assert 0 < n_features < 60

    packages = tmp_path / "Packages"
    packages.write_text(index_text())
    out = tmp_path / "set"
    subprocess.run(["python3", str(REPO / "scripts" / "debian_packages_set.py"), str(out),
                    "--packages", str(packages)], check=True)
    lines = (out / "train.txt").read_text().splitlines()
    assert lines[0] == f"{len(train)} {n_features} {n_labels}"
    values = [float(pair.split(":")[1]) for pair in lines[1].split(" ")[1:]]
    assert math.isclose(sum(v * v for v in values), 1.0, rel_tol=1e-4)
    run = subprocess.run([cli, "train", "--train", str(out / "train.txt"), "--test",
                          str(out / "test.txt"), "--epochs", "1", "--hidden", "8", "--threads",
                          "1", "--no-progress"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "final: P@1" in run.stdout


def test_a_bad_index_is_named(tmp_path):
    packages = tmp_path / "Packages"
    packages.write_text("Package: lonely\nDescription: no relations\n")
    run = subprocess.run(["python3", str(REPO / "scripts" / "debian_packages_set.py"),
                          str(tmp_path / "out"), "--packages", str(packages)],
                         capture_output=True, text=True)
    assert run.returncode != 0 and str(packages) in run.stderr and "Depends" in run.stderr
