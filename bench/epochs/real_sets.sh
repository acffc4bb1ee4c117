# The real sets' flags for bench/epochs' scripts (sourced): real_set_flags NAME sets the array
# `data` to `hslide train`'s data flags for bibtex, corel5k, debian or yeast, from $HSLIDE_DATA
# (../shared/data), or deps, from $HSLIDE_DEPS (/tmp/debian-depends: written by
# scripts/debian_packages_set.py from this machine's apt index where it is missing), or tags, from
# $HSLIDE_TAGS (/tmp/debian-tags: the same index's debtags as labels, --field Tag).
real_set_flags() {
    local D=${HSLIDE_DATA:-../shared/data}
    case $1 in
        bibtex) data=(--train $D/bibtex/Bibtex_data.txt --train-split $D/bibtex/bibtex_trSplit.txt
                      --test-split $D/bibtex/bibtex_tstSplit.txt) ;;
        corel5k) data=(--train $D/corel5k/corel5k_train.txt --test $D/corel5k/corel5k_test.txt) ;;
        debian) data=(--train $D/debian-recs/train.txt --test $D/debian-recs/test.txt) ;;
        yeast) data=(--train $D/yeast/yeast_train.txt --test $D/yeast/yeast_test.txt) ;;
        deps)
            local P=${HSLIDE_DEPS:-/tmp/debian-depends}
            [[ -f $P/test.txt ]] || "$(dirname "${BASH_SOURCE[0]}")/../../scripts/debian_packages_set.py" "$P" >&2
            data=(--train $P/train.txt --test $P/test.txt) ;;
        tags)
            local T=${HSLIDE_TAGS:-/tmp/debian-tags}
            [[ -f $T/test.txt ]] || "$(dirname "${BASH_SOURCE[0]}")/../../scripts/debian_packages_set.py" "$T" --field Tag >&2
            data=(--train $T/train.txt --test $T/test.txt) ;;
        *) echo "unknown set $1" >&2; exit 2 ;;
    esac
}
