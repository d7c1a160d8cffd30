#!/usr/bin/env bash
# Runs on the 2-GPU machine (device tool) from the repository root of the copied tree, in steps that share the
# machine while it stays warm:
#   build   builds this tree into /tmp/build-new (unless the build was carried as .carry/build, staged by
#           bench/dev/stage_build.sh), the baseline tree carried as .carry/base (braid-bench only) into
#           /tmp/build-base, and for each folder .carry/variant-NAME this tree with that folder's files laid
#           over it (braid-bench only) into /tmp/build-NAME (bench/dev/device_build.sh)
#   check   the ordering and LL-wrap tests (CHECK_FILTER), as threads and as braid-run processes, on WORLD
#           ranks (2 unless set)
#   suite   `ctest -L gpu` with its wall time, then `ctest -L long`
#   small   only the small all-reduces in graphs, base, new and the variants interleaved, twice
#   bench   braid-bench --compare nccl of the builds, one after the other for each configuration (the small
#           all-reduces in graphs twice, base, new and the variants interleaved)
#   sweep   every collective from 8 KiB to 256 MiB (x8 steps) on symmetric buffers in graphs, float32, base and new one after the
#           other for each collective
# Logs go to $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never multicast there
out=${OUT:-/tmp/out}
mkdir -p "$out"
repo=$PWD
world=${WORLD:-2}  # ranks of the check step
new=/tmp/build-new base=/tmp/build-base
variants=()
for overlay in .carry/variant-*/; do
  [ -d "$overlay" ] || continue
  name=${overlay#.carry/variant-}; variants+=("${name%/}")
done
[ -f .carry/build.tgz ] && [ ! -d .carry/build ] && tar -C .carry -xzf .carry/build.tgz  # bench/dev/stage_build.sh
if [ -d .carry/build ]; then  # built here and carried: CTest files name /work/main/build
  [ -e build ] || ln -s .carry/build build
  if [ "$repo" != /work/main ]; then mkdir -p /work && ln -sfn "$repo" /work/main; fi
  new=/work/main/build
fi
tests=$new/tests/gpu/braid_gpu_tests
run=$new/tools/braid-run/braid-run
for step in "$@"; do
  case "$step" in
    build)
      nvidia-smi -L
      start=$(date +%s)
      [ "$new" = /tmp/build-new ] && bench/dev/device_build.sh "$repo" "$new" >"$out/build-new.txt" 2>&1 &
      bench/dev/device_build.sh "$repo/.carry/base" "$base" braid-bench >"$out/build-base.txt" 2>&1 &
      for name in "${variants[@]}"; do
        mkdir -p "/tmp/src-$name"
        tar --exclude=./.carry --exclude=./build -cf - . | tar -x -C "/tmp/src-$name"
        cp -r "$repo/.carry/variant-$name/." "/tmp/src-$name/" &&
          bench/dev/device_build.sh "/tmp/src-$name" "/tmp/build-$name" braid-bench >"$out/build-$name.txt" 2>&1 &
      done
      wait
      cat "$out"/build-*.txt
      echo "builds took $(( $(date +%s) - start )) s"
      ;;
    check)
      filter=${CHECK_FILTER:-Ordering.*:LLFlags.*:Agreement.*:MoeOrdering.*}
      echo "## threads, $world ranks: $filter"
      timeout 400 "$tests" --world="$world" --gtest_filter="$filter" >"$out/check-threads.txt" 2>&1
      echo "exit $?"; grep -E "^\[  (PASSED|FAILED)|FAILED|OK \]|Failure|expected|wrong" "$out/check-threads.txt" | head -40
      echo "## processes, $world ranks: $filter"
      timeout 400 "$run" -n "$world" -- "$tests" --gtest_filter="$filter" >"$out/check-processes.txt" 2>&1
      echo "exit $?"; grep -E "PASSED|FAILED|Failure|wrong" "$out/check-processes.txt" | head -30
      ;;
    suite)
      start=$(date +%s)
      ctest --test-dir "$new" -L gpu --timeout 600 -V >"$out/suite-gpu.txt" 2>&1
      echo "ctest -L gpu: exit $?, $(( $(date +%s) - start )) s"
      grep -E "tests passed|Test +#|Total Test" "$out/suite-gpu.txt"
      grep -E "OK \] .*\(([0-9]{4,}) ms\)|FAILED \]" "$out/suite-gpu.txt" | sort -u | head -40
      ;;
    long)
      start=$(date +%s)
      ctest --test-dir "$new" -L long --timeout 600 -V >"$out/suite-long.txt" 2>&1
      echo "ctest -L long: exit $?, $(( $(date +%s) - start )) s"
      grep -E "tests passed|Test +#|Total Test" "$out/suite-long.txt"
      ;;
    small|bench|sweep)
      nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))")
      ab() {  # name, builds ("base new ..."), then braid-bench arguments
        local name=$1 builds=$2; shift 2
        for build in $builds; do
          local dir=/tmp/build-$build
          [ "$build" = new ] && dir=$new
          echo "## $build: braid-bench -t 2 $*" >>"$out/bench-$name.txt"
          timeout 200 stdbuf -oL "$dir/tools/braid-bench/braid-bench" -t 2 --compare nccl --nccl-lib "$nccl_dir/libnccl.so.2" \
            "$@" --json "$out/bench-$name-$build.json" >>"$out/bench-$name.txt" 2>&1
          echo "## exit $?" >>"$out/bench-$name.txt"
        done
      }
      all="base new ${variants[*]}"
      if [ "$step" = sweep ]; then
        for collective in allreduce reduce reducescatter allgather broadcast alltoall; do
          ab "sweep-$collective" "base new" --coll "$collective" -d float32 -b 8K -e 256M -f 8 -G 20 --symmetric 1
        done
        cat "$out"/bench-sweep-*.txt | grep -E "^##|^ +[0-9]" | grep -v "## exit" | awk '/^##/{print $2, $6} !/^##/{print $1, $6, $10}'
        continue
      fi
      ab allreduce-bf16-graph-small "$all $all" --coll allreduce -d bfloat16 -b 8K -e 8M -f 4 -G 20
      if [ "$step" = small ]; then
        grep -E "^##|^ +[0-9]" "$out/bench-allreduce-bf16-graph-small.txt" | grep -v "## exit" | awk '/^##/{print $2} !/^##/{print $1, $6, $10}'
        continue
      fi
      ab allreduce-bf16-graph "base new" --coll allreduce -d bfloat16 -b 32M -e 128M -f 4 -G 20
      ab allreduce-bf16-eager "base new" --coll allreduce -d bfloat16 -b 8K -e 512K -f 4
      ab allreduce-f32-512M "base new" --coll allreduce -d float32 -b 512M -e 512M
      ab allgather-f32-512M "base new" --coll allgather -d float32 -b 512M -e 512M
      ab reducescatter-f32-512M "base new" --coll reducescatter -d float32 -b 512M -e 512M
      ab alltoall-f32-512M "base new" --coll alltoall -d float32 -b 512M -e 512M
      cat "$out"/bench-*.txt | grep -v "^\[1\]" | grep -E "^##|^ +[0-9]" | head -120
      ;;
  esac
done
