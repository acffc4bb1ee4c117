#!/usr/bin/env python3
"""Writes a real extreme multi-label set, in XC format, from Debian's package index.

For each binary package that names others in FIELD (Depends by default), predict those
packages from its own metadata: the words of its name and short description, its section,
debtags, maintainer, priority and architecture. Features are binary and L2-normalised, kept
where seen in at least 2 packages; labels are kept where seen in at least 2 training
packages, and points left without a label are dropped; the split is 80/20 by a hash of the
package name. `../shared/data/debian-recs` is this recipe over Recommends and Suggests
(`--field Recommends+Suggests`, from another snapshot of the index and another split hash).
`--field Tag` predicts a package's debtags instead (a few hundred labels, many a point; the
tags are then left out of the features). `--long-descriptions` adds the words of each package's
long description (apt's Translation-en index) as features: a text-like set, with several times
the features a point (the shape of XC's document sets, where the input layer costs more).
`--file-words` adds the words of the paths each package installs (Debian's Contents indices):
a hundred or more features a point, the many-features shape of EURLex-4K or Wiki10-31K.

Depends over bookworm main amd64 (2026-12): 43,408 train / 10,566 test points, 25,089
features, 15,591 labels, 4.7 labels a point: the shape of the held-out power-law set issue 30
quotes (15,658 labels, 43.6k points). bench/peers.md measures hslide and napkinXC on it.

Usage: scripts/debian_packages_set.py OUT_DIR [--field Depends] [--packages FILE]
                                      [--long-descriptions [FILE]] [--file-words FILE...]
  --packages: a Packages file (plain, or compressed: read through apt-helper cat-file);
  default: this machine's apt index of a Debian main amd64 suite
  (/var/lib/apt/lists/*_main_binary-amd64_Packages*, the largest; `apt-get update` fetches it).
  --long-descriptions: a Translation-en file; default: the apt index's
  (/var/lib/apt/lists/*_main_i18n_Translation-en*, the largest; `apt-get update -o
  Acquire::Languages=en` fetches it where the system's apt leaves translations out).
  --file-words: Contents files (gzip or plain), e.g. the suite's main/Contents-amd64.gz and
  main/Contents-all.gz from deb.debian.org/debian/dists/bookworm/ (apt does not fetch them).
Writes OUT_DIR/train.txt and OUT_DIR/test.txt, and prints their shapes and the index's SHA-256
(the set changes with the index: say which one a figure is of).
"""

import argparse
import collections
import glob
import gzip
import hashlib
import math
import os
import re
import subprocess
import sys

WORD = re.compile(r"[a-z0-9][a-z0-9+.\-]*")
PATH_WORD = re.compile(r"[a-z][a-z0-9+]+")


def read_index(path):
    """The index's bytes (decompressed by apt-helper where the name says compressed)."""
    if path.endswith((".lz4", ".gz", ".xz", ".bz2", ".zst")):
        return subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", path], check=True,
                              stdout=subprocess.PIPE).stdout
    with open(path, "rb") as f:
        return f.read()


def stanzas(text):
    """Each package's fields (continuation lines joined for Tag, dropped elsewhere)."""
    fields, last = {}, None
    for line in text.splitlines():
        if not line:
            if fields:
                yield fields
            fields, last = {}, None
        elif line[0] in " \t":
            if last == "Tag":
                fields[last] += " " + line.strip()
        else:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
            last = key
    if fields:
        yield fields


def tags_of(fields):
    return {t.strip() for t in fields.get("Tag", "").split(",") if t.strip()}


def packages_named(fields, names):
    """The package names in the fields `names` ("a (>= 1) | b:any, c"): every alternative;
    for Tag, the debtags ("role::program, use::editing")."""
    out = set()
    for name in names:
        if name == "Tag":
            out |= tags_of(fields)
            continue
        for relation in fields.get(name, "").split(","):
            for alternative in relation.split("|"):
                package = alternative.strip().split(" ")[0].split(":")[0].split("(")[0]
                if package:
                    out.add(package)
    return out


def long_descriptions(text):
    """Each described package's long description (Translation-en: "Description-en: short"
    and its continuation lines), by Description-md5 and by package name."""
    out = {}
    fields, key, lines = {}, None, []
    for line in text.splitlines() + [""]:
        if not line:
            if "Package" in fields and lines:
                body = " ".join(lines)
                out.setdefault(("md5", fields.get("Description-md5", "")), body)
                out.setdefault(("name", fields["Package"]), body)
            fields, key, lines = {}, None, []
        elif line[0] in " \t":
            if key == "Description-en" and line.strip() != ".":
                lines.append(line.strip())
        else:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return out


def file_words(paths):
    """Each package's path words from Contents files ("usr/bin/vim   editors/vim,
    editors/vim-tiny" lines): the package name without its section, to the set of words."""
    out = collections.defaultdict(set)
    for path in paths:
        with (gzip.open(path, "rt", errors="replace") if path.endswith(".gz")
              else open(path, errors="replace")) as lines:
            for line in lines:
                location, _, owners = line.rstrip("\n").rpartition(" ")
                words = PATH_WORD.findall(location.lower())
                for owner in owners.split(","):
                    out[owner.rsplit("/", 1)[-1]].update(words)
    return out


def features_of(fields, with_tags=True, long=None, files=None):
    name = fields["Package"]
    out = {"n=" + w for w in WORD.findall(name.lower().replace("-", " "))}
    out |= {"d=" + w for w in WORD.findall(fields.get("Description", "").lower())}
    if long is not None:
        body = long.get(("md5", fields.get("Description-md5", "")),
                        long.get(("name", name), ""))
        out |= {"l=" + w for w in WORD.findall(body.lower())}
    if files is not None:
        out |= {"f=" + w for w in files.get(name, ())}
    for key, prefix in (("Section", "s="), ("Priority", "p="), ("Architecture", "a="),
                        ("Maintainer", "m=")):
        out.add(prefix + fields.get(key, ""))
    if with_tags:
        out |= {"t=" + t for t in tags_of(fields)}
    return out


def build(text, field_names, long=None, files=None):
    """(train, test, n_features, n_labels): points as (feature ids, label ids); `long`:
    long_descriptions' map, `files`: file_words' map, whose words join the features."""
    rows = []
    for fields in stanzas(text):
        if "Package" not in fields:
            continue
        labels = packages_named(fields, field_names)
        if not labels:
            continue
        name = fields["Package"]
        test = int(hashlib.md5(name.encode()).hexdigest(), 16) % 5 == 0
        rows.append((test, features_of(fields, "Tag" not in field_names, long, files), labels))
    feature_count = collections.Counter(f for _, fs, _ in rows for f in fs)
    label_count = collections.Counter(l for test, _, ls in rows if not test for l in ls)
    feature_id = {f: i for i, f in enumerate(sorted(f for f, c in feature_count.items() if c >= 2))}
    label_id = {l: i for i, l in enumerate(sorted(l for l, c in label_count.items() if c >= 2))}
    parts = {False: [], True: []}
    for test, fs, ls in rows:
        ys = sorted(label_id[l] for l in ls if l in label_id)
        if ys:
            parts[test].append((sorted(feature_id[f] for f in fs if f in feature_id), ys))
    return parts[False], parts[True], len(feature_id), len(label_id)


def write(path, points, n_features, n_labels):
    with open(path, "w") as out:
        out.write(f"{len(points)} {n_features} {n_labels}\n")
        for features, labels in points:
            value = 1.0 / math.sqrt(len(features)) if features else 0.0
            out.write(",".join(map(str, labels)) + " " +
                      " ".join(f"{f}:{value:.6f}" for f in features) + "\n")


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def largest_list(pattern, missing):
    """The largest of apt's lists matching `pattern`; exits saying `missing` where none does."""
    found = glob.glob("/var/lib/apt/lists/" + pattern)
    if not found:
        sys.exit(f"debian_packages_set.py: no {missing} in /var/lib/apt/lists")
    return max(found, key=os.path.getsize)


def default_index():
    return largest_list("*_main_binary-amd64_Packages*", "apt index of a main amd64 suite (run "
                        "apt-get update, or pass --packages FILE)")


def default_translations():
    return largest_list("*_main_i18n_Translation-en*", "Translation-en index (run apt-get "
                        "update -o Acquire::Languages=en, or pass --long-descriptions FILE)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--field", default="Depends",
                        help="the relation(s) to predict, joined by + (default Depends)")
    parser.add_argument("--packages", help="a Packages file (default: the apt index)")
    parser.add_argument("--long-descriptions", nargs="?", const="", metavar="FILE",
                        help="add the words of the packages' long descriptions (a "
                        "Translation-en file; default: the apt index's)")
    parser.add_argument("--file-words", nargs="+", metavar="FILE",
                        help="add the words of the paths each package installs (Contents "
                        "files)")
    args = parser.parse_args()
    path = args.packages or default_index()
    data = read_index(path)
    long, long_note = None, ""
    if args.long_descriptions is not None:
        long_path = args.long_descriptions or default_translations()
        long_data = read_index(long_path)
        long = long_descriptions(long_data.decode("utf-8", "replace"))
        long_note = (f", long descriptions of {long_path} "
                     f"(SHA-256 {hashlib.sha256(long_data).hexdigest()})")
    files, files_note = None, ""
    if args.file_words:
        files = file_words(args.file_words)
        files_note = ", path words of " + " ".join(
            f"{p} (SHA-256 {sha256_of(p)})" for p in args.file_words)
    train, test, n_features, n_labels = build(data.decode("utf-8", "replace"),
                                              args.field.split("+"), long, files)
    if not train or not test:
        sys.exit(f"debian_packages_set.py: {path}: no package with a kept {args.field} label "
                 "in the train or the test part")
    os.makedirs(args.out_dir, exist_ok=True)
    write(os.path.join(args.out_dir, "train.txt"), train, n_features, n_labels)
    write(os.path.join(args.out_dir, "test.txt"), test, n_features, n_labels)
    print(f"{args.out_dir}: {args.field} of {path} (SHA-256 {hashlib.sha256(data).hexdigest()})"
          f"{long_note}{files_note}: "
          f"{len(train)} train / {len(test)} test points, {n_features} features, "
          f"{n_labels} labels")


if __name__ == "__main__":
    main()
