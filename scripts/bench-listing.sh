#!/usr/bin/env bash
# Benchmark: listing a prefix with many checkpoints (default 10,000) through the
# mount, against `aws s3 ls` of the same prefix. The root of the mount needs only
# object listings: no object is downloaded or HEADed. Prints a Markdown table on
# stdout (progress on stderr). See BENCHMARKS.md.
#
# Environment:
#   BENCH_CHECKPOINTS  number of objects (default 10000)
#   BENCH_RUNS         runs per measurement; the median is reported (default 3)
#   BENCH_DIR, BENCH_KEEP, CKPTFS_BIN   as for the other benchmark scripts
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh

N="${BENCH_CHECKPOINTS:-10000}"
CKPTFS_GLOBAL=()
bench_init listing
bench_deps
bench_moto
BUCKET="bench-listing-$$"
"$AWS" s3 mb "s3://$BUCKET" >/dev/null

# The objects need not be real archives: listing never reads them. Names are
# sha256 digests of their index, as any writer's would be.
log "creating $N objects under s3://$BUCKET/ckpt/"
"$CKPTFS_VENV/bin/python" - "$AWS_ENDPOINT_URL" "$BUCKET" "$N" <<'PY'
import hashlib, sys
from concurrent.futures import ThreadPoolExecutor
import boto3
endpoint, bucket, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s3 = boto3.client("s3", endpoint_url=endpoint)
def put(i):
    body = str(i).encode()
    s3.put_object(Bucket=bucket, Key=f"ckpt/{hashlib.sha256(b'%d' % i).hexdigest()}.tar.gz", Body=body)
with ThreadPoolExecutor(8) as pool:
    list(pool.map(put, range(n)))
PY

MNT="$WORK/mnt"
count_lines() { wc -l | awk '{ print $1 }'; }

for run in $(seq 1 "$BENCH_RUNS"); do
    log "run $run/$BENCH_RUNS"
    run_begin
    tm aws_ls "$AWS" s3 ls "s3://$BUCKET/ckpt/" >"$WORK/aws.txt"
    [ "$(count_lines <"$WORK/aws.txt")" -eq "$N" ] || die "aws s3 ls did not list $N objects"
    CACHE="$WORK/cache-$run"
    mount_ckptfs "s3://$BUCKET/ckpt" "$MNT" "$CACHE"
    tm ls_first ls "$MNT" >"$WORK/ls1.txt"
    tm ls_second ls "$MNT" >/dev/null
    tm ls_l ls -l "$MNT" >/dev/null
    tm by_time ls "$MNT/by-time" >/dev/null
    # +4: by-time, commit, latest, staging
    [ "$(count_lines <"$WORK/ls1.txt")" -eq "$((N + 4))" ] || die "the mount did not list $N checkpoints"
    grep -q "downloads: 0;" "$MNT/.status" || die "listing downloaded something"
    record aws "$(step_secs aws_ls)"
    record mount "$(step_secs mount)"
    record ls1 "$(step_secs ls_first)"
    record ls2 "$(step_secs ls_second)"
    record lsl "$(step_secs ls_l)"
    record bytime "$(step_secs by_time)"
    record rss "$(vmhwm "$CKPT_PID")"
    unmount_wait "$MNT" "$CKPT_PID"
done

cat <<MD

### Listing $N checkpoints: the mount's root vs aws s3 ls (moto)

Median of $BENCH_RUNS runs; each run mounts anew with an empty cache (the mount lists the store once before it returns).

| measurement | seconds | ratio to \`aws s3 ls\` |
| --- | --- | --- |
| \`aws s3 ls s3://BUCKET/ckpt/\` | $(med aws) | 1.00 |
| \`ckptfs mount\` (includes the first listing) | $(med mount) | $(ratio "$(med mount)" "$(med aws)") |
| \`ls MNT\`, first | $(med ls1) | $(ratio "$(med ls1)" "$(med aws)") |
| \`ls MNT\`, again | $(med ls2) | $(ratio "$(med ls2)" "$(med aws)") |
| \`ls -l MNT\` | $(med lsl) | $(ratio "$(med lsl)" "$(med aws)") |
| \`ls MNT/by-time\` | $(med bytime) | $(ratio "$(med bytime)" "$(med aws)") |

Daemon peak RSS: $(mib "$(med rss)") MiB. \`.status\` shows \`downloads: 0\` after all of it.
MD
