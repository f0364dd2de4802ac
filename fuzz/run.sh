#!/usr/bin/env bash
# Fuzzes every vigil parser with cargo-fuzz (libFuzzer), one target after another.
#
#   fuzz/run.sh [seconds]      each target for `seconds` (default 60); exit 1 if any crashed
#   fuzz/run.sh replay         run the saved reproducers in fuzz/regressions/<target>/ once
#                              each (exit 1 while any of them still crashes)
#
# Environment:
#   FUZZ_SANITIZER   address (default) or none; `none` builds faster and runs ~2x faster
#                    but only catches panics, not memory errors (all vigil crates forbid
#                    unsafe code, so panics are what we look for).
#   FUZZ_JOBS        libFuzzer jobs per target (default 1).
#   FUZZ_NICE        nice level (default 10: the fuzzer yields to interactive work).
#
# Only stable Rust is installed; cargo-fuzz needs -Z flags, so RUSTC_BOOTSTRAP=1 is set
# here (see docs/fuzzing.md). New inputs go to fuzz/generated/<target>/ (ignored by
# git); the committed seeds in fuzz/corpus/<target>/ are read, never written.
set -euo pipefail

cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
sanitizer="${FUZZ_SANITIZER:-address}"
jobs="${FUZZ_JOBS:-1}"
nice_level="${FUZZ_NICE:-10}"
mode="${1:-60}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "run.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

nice -n "$nice_level" cargo fuzz build --sanitizer "$sanitizer"
targets=$(cargo fuzz list)
failed=()

if [[ "$mode" == replay ]]; then
    for t in $targets; do
        dir="regressions/$t"
        [[ -d "$dir" ]] || continue
        for f in "$dir"/*; do
            [[ -f "$f" && "$f" != *.md && "$f" != *.txt ]] || continue
            echo "=== replay $t $f" >&2
            if ! nice -n "$nice_level" cargo fuzz run --sanitizer "$sanitizer" "$t" "$f" >/dev/null 2>&1; then
                echo "STILL CRASHES: $t $f" >&2
                failed+=("$t:$f")
            fi
        done
    done
else
    if ! [[ "$mode" =~ ^[0-9]+$ ]]; then
        echo "usage: $0 [seconds|replay]" >&2
        exit 2
    fi
    for t in $targets; do
        mkdir -p "generated/$t"
        echo "=== fuzz $t for ${mode}s" >&2
        # First corpus directory is where libFuzzer writes new inputs.
        if ! nice -n "$nice_level" cargo fuzz run --sanitizer "$sanitizer" --jobs "$jobs" \
            "$t" "generated/$t" "corpus/$t" -- \
            -max_total_time="$mode" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1; then
            echo "CRASH: $t (reproducer under fuzz/artifacts/$t/)" >&2
            failed+=("$t")
        fi
    done
fi

if ((${#failed[@]})); then
    echo "failed: ${failed[*]}" >&2
    exit 1
fi
echo "all targets clean" >&2
