"""scripts/debian_packages_set.py: a real XC set from a Debian package index, on a small
index written here (the recipe's rules: relations parsed, rare features and labels dropped,
points without a label dropped, the split by name), and `hslide train` reads what it writes."""

import gzip
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


def test_long_descriptions_add_their_words(tmp_path):
    # Packages match their translation by Description-md5, else by name; a "." line is a
    # paragraph break, not a word.
    translations = ("Package: pkg-1\nDescription-md5: 0123\nDescription-en: short\n"
                    " paragraph about widgets\n .\n more widgets\n\n"
                    "Package: pkg-3\nDescription-en: short\n widgets too\n")
    long = script.long_descriptions(translations)
    assert long[("md5", "0123")] == "paragraph about widgets more widgets"
    assert long[("name", "pkg-3")] == "widgets too"
    fields = {"Package": "pkg-1", "Description": "tool", "Description-md5": "0123"}
    words = script.features_of(fields, long=long)
    assert {"l=paragraph", "l=widgets", "l=more"} <= words and "l=." not in words
    assert script.features_of(fields) == {f for f in words if not f.startswith("l=")}

    # Every package of the small index described: "widgets" is in every point's features.
    text = "".join(f"Package: pkg-{i}\nDescription-en: x\n widgets for {i}\n\n" for i in range(60))
    (tmp_path / "Translation-en").write_text(text)
    words_join_every_point(tmp_path, (script.long_descriptions(text),), "--long-descriptions",
                           tmp_path / "Translation-en", "long descriptions of")


def words_join_every_point(tmp_path, extra, flag, path, says):
    """Over the small index, build with `extra` (its arguments after the field names) has more
    features, and more in every point, than without; the script run with `flag path` writes as
    many features and says `says`."""
    (tmp_path / "Packages").write_text(index_text())
    plain, _, n_plain, _ = script.build(index_text(), ["Depends"])
    train, _, n_features, _ = script.build(index_text(), ["Depends"], *extra)
    assert n_features > n_plain
    assert all(len(a) > len(b) for (a, _), (b, _) in zip(train, plain))
    out = tmp_path / "set"
    run = subprocess.run(["python3", str(REPO / "scripts" / "debian_packages_set.py"), str(out),
                          "--packages", str(tmp_path / "Packages"), flag, str(path)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert says in run.stdout
    assert (out / "train.txt").read_text().splitlines()[0].split()[1] == str(n_features)


def test_file_words_add_the_words_of_the_paths_a_package_installs(tmp_path):
    # A Contents line is "path   section/package,section/other": every owner gets the path's
    # words (lower case, two characters or more, starting with a letter); gzip or plain.
    contents = ("usr/bin/Widget-Tool                         utils/pkg-1,utils/pkg-3\n"
                "usr/share/doc/pkg-1/x.gz                    utils/pkg-1\n")
    (tmp_path / "Contents-all").write_text(contents)
    with gzip.open(tmp_path / "Contents-amd64.gz", "wt") as f:
        f.write("usr/lib/x86_64-linux-gnu/libwidget.so.1     libs/pkg-3\n")
    files = script.file_words([str(tmp_path / "Contents-all"), str(tmp_path / "Contents-amd64.gz")])
    assert files["pkg-1"] == {"usr", "bin", "widget", "tool", "share", "doc", "pkg", "gz"}
    assert {"widget", "tool", "lib", "x86", "linux", "gnu", "libwidget", "so"} <= files["pkg-3"]
    fields = {"Package": "pkg-1", "Description": "tool"}
    words = script.features_of(fields, files=files)
    assert {"f=widget", "f=doc"} <= words
    assert script.features_of(fields) == {f for f in words if not f.startswith("f=")}

    # Every package of the small index installs a file: its words join every point.
    text = "".join(f"usr/share/widgets/w{i}.txt  utils/pkg-{i}\n" for i in range(60))
    (tmp_path / "Contents").write_text(text)
    words_join_every_point(tmp_path, (None, script.file_words([str(tmp_path / "Contents")])),
                           "--file-words", tmp_path / "Contents", "path words of")
