#!/bin/sh
# The probe beside a CUDA-graph reference on each NCCL transport of a two-GPU host (tests/device/probe_vs_graph.py
# says what each run times). GPU-only, run by hand from the repository root:
#   sh tests/device/probe_vs_graph.sh [PROBE [TIMING]] > probe-vs-graph.log
# PROBE defaults to this checkout's sparkcluster/nccl/probe.py; TIMING is its --latency-timing (auto, graph, eager);
# WARM=N sets its WARM_SAMPLES (to measure what the warm-up changes).
# Transports: P2P (NVLink or PCIe), shared memory (NCCL_P2P_DISABLE=1), sockets over lo (P2P and shared memory
# off), and sockets with each rank its own host (NCCL_HOSTID per rank). NCCL_NVLS_ENABLE=0 stays set: NVLink
# multicast is off on shared GPU hosts. NPROC=1 times one rank alone: torch short-cuts a one-rank all_reduce (its
# graph is empty), so that shows the timing's own overhead only (old probe 1.25 us a call, this one 0.13).
# SAME_GPU=1 puts two ranks on GPU 0 with a host each (sockets); start CUDA MPS first (nvidia-cuda-mps-control -d),
# or the two ranks' kernels take turns on the GPU.
set -u
NPROC=${NPROC:-2}
PROBE=${1:-sparkcluster/nccl/probe.py}
TIMING=${2:-}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
run() {  # LABEL SCRIPT-FLAG ENV...
    label=$1 flag=$2; shift 2
    env "$@" python3 -m torch.distributed.run --standalone --nproc-per-node=$NPROC tests/device/probe_vs_graph.py \
        --probe "$PROBE" --transport "$label" ${TIMING:+--timing "$TIMING"} ${WARM:+--warm-samples "$WARM"} $flag 2>&1 \
        | grep -v -e "^W[0-9]" -e "warnings.warn" -e "^\*\*\*"
}
if [ "${SAME_GPU:-}" = 1 ]; then
    run socket-hostid-one-gpu "--host-per-rank --same-gpu" NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo; exit
fi
if [ "$NPROC" = 1 ]; then run single-gpu "" NCCL_DEBUG=WARN; exit; fi
run p2p "" NCCL_DEBUG=WARN
run shm "" NCCL_P2P_DISABLE=1
run socket "" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo
run socket-hostid --host-per-rank NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo
