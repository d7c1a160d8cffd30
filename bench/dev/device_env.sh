# Sourced by the scripts that run on the GPU machine (device tool), from the repository root of the copied
# tree, with the build carried as .carry/build (bench/dev/stage_build.sh): multicast off, $out ready, build/ in
# place, and the tree reachable as /work/main (CTest files name the absolute paths of the machine that built
# them). Leaves the caller in /work/main.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never multicast there
repo=$PWD
out=${OUT:-/tmp/out}
mkdir -p "$out"
[ -e build ] || ln -s .carry/build build
if [ "$repo" != /work/main ]; then mkdir -p /work && ln -sfn "$repo" /work/main; fi
cd /work/main
