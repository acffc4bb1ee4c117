# The real sets' flags for bench/epochs' scripts (sourced): real_set_flags NAME sets the array
# `data` to `hslide train`'s data flags for bibtex, corel5k, debian or yeast, from $HSLIDE_DATA
# (../shared/data), or deps, from $HSLIDE_DEPS (/tmp/debian-depends: written by
# scripts/debian_packages_set.py from this machine's apt index where it is missing), or tags, from
# $HSLIDE_TAGS (/tmp/debian-tags: the same index's debtags as labels, --field Tag), or the two tiny
# sets from the same index, prov ($HSLIDE_PROVIDES, /tmp/debian-provides: --field Provides) and brk
# ($HSLIDE_BREAKS, /tmp/debian-breaks: --field Breaks+Replaces+Conflicts); depslong and tagslong
# ($HSLIDE_DEPS_LONG, $HSLIDE_TAGS_LONG) are deps and tags with the long descriptions' words
# (--long-descriptions: text-like points, about 50 features each instead of 14); depsfiles and
# tagsfiles ($HSLIDE_DEPS_FILES, $HSLIDE_TAGS_FILES) add the words of the paths each package
# installs (--file-words, from $HSLIDE_CONTENTS: the suite's Contents-amd64.gz and
# Contents-all.gz, fetched from deb.debian.org: about 66 features a point, 144K-188K features).
real_set_flags() {
    local D=${HSLIDE_DATA:-../shared/data}
    case $1 in
        bibtex) data=(--train $D/bibtex/Bibtex_data.txt --train-split $D/bibtex/bibtex_trSplit.txt
                      --test-split $D/bibtex/bibtex_tstSplit.txt) ;;
        corel5k) data=(--train $D/corel5k/corel5k_train.txt --test $D/corel5k/corel5k_test.txt) ;;
        debian) data=(--train $D/debian-recs/train.txt --test $D/debian-recs/test.txt) ;;
        yeast) data=(--train $D/yeast/yeast_train.txt --test $D/yeast/yeast_test.txt) ;;
        deps) debian_set_flags "${HSLIDE_DEPS:-/tmp/debian-depends}" Depends ;;
        tags) debian_set_flags "${HSLIDE_TAGS:-/tmp/debian-tags}" Tag ;;
        depslong) debian_set_flags "${HSLIDE_DEPS_LONG:-/tmp/debian-depends-long}" Depends --long-descriptions ;;
        tagslong) debian_set_flags "${HSLIDE_TAGS_LONG:-/tmp/debian-tags-long}" Tag --long-descriptions ;;
        depsfiles) debian_set_flags "${HSLIDE_DEPS_FILES:-/tmp/debian-depends-files}" Depends --file-words ;;
        tagsfiles) debian_set_flags "${HSLIDE_TAGS_FILES:-/tmp/debian-tags-files}" Tag --file-words ;;
        prov) debian_set_flags "${HSLIDE_PROVIDES:-/tmp/debian-provides}" Provides ;;
        brk) debian_set_flags "${HSLIDE_BREAKS:-/tmp/debian-breaks}" Breaks+Replaces+Conflicts ;;
        *) echo "unknown set $1" >&2; exit 2 ;;
    esac
}

# debian_set_flags DIR FIELD [FLAG]: `data` for DIR's set of Debian's FIELD, written there (with
# debian_packages_set.py's FLAG; --file-words reads $HSLIDE_CONTENTS) when missing.
debian_set_flags() {
    local flags=(${3:-})
    [[ ${3:-} == --file-words ]] && flags+=(${HSLIDE_CONTENTS:?set HSLIDE_CONTENTS to the Contents-amd64.gz and Contents-all.gz paths})
    [[ -f $1/test.txt ]] || "$(dirname "${BASH_SOURCE[0]}")/../../scripts/debian_packages_set.py" "$1" --field "$2" "${flags[@]}" >&2
    data=(--train $1/train.txt --test $1/test.txt)
}
