#!/usr/bin/env bash
# Session-3 exploration call: read floors, ncu of the GEMVs under target, new plans and TMA variants.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
uname -r
python3 bench/bench_stream_floor.py --out "$OUT/stream_floor_h200.json" 2>&1 | tail -40
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu)
echo "ncu: $NCU"
timeout 150 "$NCU" --clock-control none --profile-from-start off --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats python3 bench/explore/ncu_probe.py > "$OUT/ncu_probe.txt" 2>&1
echo "ncu rc $?"
grep -E "^  [a-zA-Z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|Achieved Occupancy|Registers Per|Shared Memory Configuration Size|Dynamic Shared|Waves Per SM|Stall|Warp Cycles Per Issued|Block Limit|Issued Warp|One or More|No Eligible|Theoretical Occ|Grid Size" "$OUT/ncu_probe.txt" | head -150
timeout 330 python3 bench/explore/explore5.py --out "$OUT/explore5.json" --budget-s 300 2>&1 | tail -80
