#!/bin/sh
# The torture campaign (README "The gate: moneta-torture"): differential
# runs of FS (xfs or ext4) in chunks of one seed each, from seed FIRST up,
# until DEADLINE (a date(1) time), on a fresh Moneta file system of its own
# at MOUNT. Every chunk's seed, operations, outcome and phase times are
# appended to LOG as one line; a chunk with differences stops the campaign
# (its files and results are kept for `moneta-torture shrink`).
#
#   campaign.sh BIN FS MOUNT FIRST DEADLINE LOG [OPS_PER_WORKER] [WORKERS]
#
# BIN holds moneta, moneta-torture and libmoneta_preload.so (a copy, so a
# rebuild during the campaign does not change what runs).
set -u
bin=$1 fs=$2 mount=$3 seed=$4 deadline=$5 log=$6
ops=${7:-5000} workers=${8:-4}
end=$(date -d "$deadline" +%s) || exit 2
"$bin/moneta" up --mount "$mount" --size 512M --fs "$fs" --fresh >/dev/null || exit 1
trap '"$bin/moneta" down --purge --mount "$mount" >/dev/null 2>&1' EXIT
total=0
while [ "$(date +%s)" -lt "$end" ]; do
    res=/tmp/$(basename "$mount")-results-$seed
    out=$(nice -n 10 "$bin/moneta-torture" run --mount "$mount" --moneta "$bin/moneta" \
        --seed "$seed" --ops "$ops" --workers "$workers" --results "$res" --json 2>"$res.err")
    code=$?
    if [ $code -eq 0 ]; then
        total=$((total + ops * workers))
        rm -rf "$res" "$res.err"
        echo "$(date -u +%H:%M:%S) $fs seed $seed ops $((ops * workers)) ok total $total $out" >>"$log"
    else
        echo "$(date -u +%H:%M:%S) $fs seed $seed ops $((ops * workers)) DIFFERENCES (exit $code; $res, $res.err) $out" >>"$log"
        trap - EXIT
        exit 1
    fi
    seed=$((seed + 1))
done
echo "$(date -u +%H:%M:%S) $fs done: $total operations from seed $4 to $((seed - 1)), no differences" >>"$log"
