#!/usr/bin/env bash
# Runs every cargo-fuzz target of idemhook for a bounded time.
#
#   bash tests/fuzz/run.sh [SECONDS] [TARGET...]     # default: 60 s, every target
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`). cargo-fuzz passes nightly
# flags (-Zsanitizer=address); on the machine's stable toolchain
# RUSTC_BOOTSTRAP=1 lets rustc take them. The corpus grows in
# tests/fuzz/corpus/TARGET (seeded from tests/fuzz/seeds/TARGET), crashes
# land in tests/fuzz/artifacts/TARGET; both are ignored by git. Exits
# non-zero when any target found a crash, after running them all.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
seconds="${1:-60}"
shift || true

command -v cargo-fuzz >/dev/null || {
    echo "cargo-fuzz is not installed: cargo install cargo-fuzz" >&2
    exit 2
}
export RUSTC_BOOTSTRAP=1

cd "$here"
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list --fuzz-dir "$here")
fi

cargo fuzz build --fuzz-dir "$here"

failed=()
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    if [ -d "seeds/$target" ]; then
        cp -n "seeds/$target"/* "corpus/$target"/ 2>/dev/null || true
    fi
    extra=()
    runner=(env)
    if [ "$target" = http_server ]; then
        # The server's connection threads are detached and may still be
        # ending when LeakSanitizer looks, after an input or at exit: their
        # thread handles and thread-local destructors show up as leaks that
        # are not (seen in the first runs).
        extra=(-detect_leaks=0)
        runner=(env ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
    fi
    echo "== $target: ${seconds}s"
    if ! "${runner[@]}" cargo fuzz run --fuzz-dir "$here" "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 "${extra[@]}"; then
        failed+=("$target")
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "crashes in: ${failed[*]} (inputs under tests/fuzz/artifacts/)" >&2
    exit 1
fi
echo "no crash in ${#targets[@]} targets, ${seconds}s each"
