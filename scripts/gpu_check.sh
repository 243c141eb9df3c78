#!/usr/bin/env bash
# GPU checks for the training engine on one GPU (sized for one H200, < 9 min):
# the GPU-only tests (NCCL path trains, reports MFU; CUDA computes the same
# model as the CPU path, eager and compiled; train.float8 on FP8 tensor
# cores) and the model=1b benchmark (bf16; compile on/off; activation
# checkpointing modes; compile + float8 tensorwise, the speedup to compare
# with the performance model's 1.28x).
# Results: printed, and under $OUT (or ./gpu_check_out) as JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
out="${OUT:-gpu_check_out}"
mkdir -p "$out"
export TMPDIR="$(mktemp -d)"
trap 'rm -rf "$TMPDIR"' EXIT

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c 'import torch; assert torch.cuda.is_available(), "CPU-only torch"; print("torch", torch.__version__, "cuda", torch.version.cuda)'
pip show meshrun >/dev/null 2>&1 || pip install -q -e . >/dev/null

start=$SECONDS
# ~2 min: 6 short runs of tiny/verify models.
python -c 'import torchao' 2>/dev/null || pip install -q -e '.[float8]' >/dev/null ||
  echo "gpu_check: torchao could not be installed: the float8 checks will fail"
timeout 300 python -m pytest -q -p no:cacheprovider tests/test_train_gpu.py 2>&1 | tee "$out/gpu_tests.txt"
echo "gpu tests: $((SECONDS - start)) s"
# ~5 min: 5 variants of a 1B model, 10 steps each, 8 x 4096 tokens a step
# (micro-batch 2: activations of AC=none fit comfortably in 141 GB).
timeout 400 python scripts/bench_train.py model=1b train.global_batch_size=8 train.micro_batch_size=2 \
  --steps 10 --variants bf16,bf16+compile,bf16+compile+float8,bf16+ac_selective,bf16+ac_full \
  --json "$out/bench_1b.json" \
  2>&1 | tee "$out/bench_1b.txt"
echo "gpu_check: done in $((SECONDS - start)) s"
