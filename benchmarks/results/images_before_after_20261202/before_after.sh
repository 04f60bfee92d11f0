#!/usr/bin/env bash
# Before (docker BuildKit pipeline, commit f6c0fc7) and after (buildah pipeline, integrate-14) in one run,
# one after the other on this host: cold build, warm rebuild, image sizes, for cu130-torch211.
set -uo pipefail
OUT=/work/ba; mkdir -p $OUT
ENV=cu130-torch211
log() { printf '%s %s\n' "$(date -u +%FT%TZ)" "$*" | tee -a $OUT/summary.txt; }
clean_engine() {
  docker ps -aq | xargs -r docker rm -f >/dev/null
  docker images --format '{{.Repository}}:{{.Tag}}' | grep -E '^(flashkit|fk-)' | xargs -r docker rmi -f >/dev/null 2>&1
  docker image prune -af >/dev/null; docker builder prune -af >/dev/null
}
timeit() { local s=$(date +%s); "$@"; local rc=$?; echo "$(( $(date +%s) - s )) $rc"; }

log "before: /work/before at $(git -C /work/before rev-parse --short HEAD); after: /work/main at $(git -C /work/main rev-parse --short HEAD)"
log "host: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), docker $(docker version -f '{{.Server.Version}}'), buildah $(buildah --version | cut -d' ' -f3)"
# ---- before: BuildKit
clean_engine; rm -rf /work/before/.work
cd /work/before
log "before: cold (fresh engine: no images, no build cache)"
r=$(timeit .venv/bin/flashkit build $ENV --no-cache --quiet >$OUT/before-cold.txt 2>&1); log "before cold: seconds rc = $r"
for f in .work/logs/$ENV-*.log; do cp $f $OUT/before-$(basename $f); done
r=$(timeit .venv/bin/flashkit build $ENV --rebuild --quiet >$OUT/before-warm.txt 2>&1); log "before warm: seconds rc = $r"
docker images --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}' | grep -E '^flashkit' | tee -a $OUT/summary.txt
for i in $(docker images -q --filter reference='flashkit/*' | sort -u); do docker image inspect -f '{{index .RepoTags 0}} {{.Id}} {{.Size}} bytes' $i; done | tee -a $OUT/summary.txt
for f in .work/builds/$ENV-*.json; do cp $f $OUT/before-$(basename $f); done
log "load $(cut -d' ' -f1-3 /proc/loadavg)"
# ---- after: buildah
clean_engine; rm -rf /var/tmp/fk-ba; cd /work/main; rm -rf .work
export FLASHKIT_BUILDAH_ROOT=/var/tmp/fk-ba FLASHKIT_IMAGE_NAMESPACE=fk-ba
log "after: cold (fresh buildah storage, fresh engine)"
r=$(timeit /work/main/.nox/tests/bin/flashkit build $ENV --quiet >$OUT/after-cold.txt 2>&1); log "after cold: seconds rc = $r"
for f in .work/logs/$ENV-*.log; do cp $f $OUT/after-$(basename $f); done
r=$(timeit /work/main/.nox/tests/bin/flashkit build $ENV --rebuild --quiet >$OUT/after-warm.txt 2>&1); log "after warm: seconds rc = $r"
for i in $(docker images -q --filter reference='fk-ba/*' | sort -u); do docker image inspect -f '{{index .RepoTags 0}} {{.Id}} {{.Size}} bytes' $i; done | tee -a $OUT/summary.txt
buildah --root /var/tmp/fk-ba/storage images --format '{{.Name}}:{{.Tag}} {{.ID}} {{.Size}}' 2>&1 | tee -a $OUT/summary.txt
for f in .work/builds/$ENV-*.json; do cp $f $OUT/after-$(basename $f); done
r=$(timeit /work/main/.nox/tests/bin/flashkit verify $ENV --tiers build,abi,cpu >$OUT/after-tiers.txt 2>&1); log "after tiers (not part of the build times): seconds rc = $r"
log "load $(cut -d' ' -f1-3 /proc/loadavg)"
log "done"
