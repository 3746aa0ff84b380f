"""The machine-speed probe's fixed work (:mod:`ptspeed.cell.measurement.probe`), without torch:
the report's method states it (ptspeed.render.method), and the host side imports no torch.
"""

REPETITIONS = 5
CPU_GEMM_SIZE = 256
CPU_GEMMS = 16
MEMORY_BYTES = 4 * 1024 * 1024
MEMORY_COPIES = 16
GPU_GEMM_SIZE = 4096
GPU_GEMMS = 32
# The GPU's warm-up: at least GPU_WARMUP_S of the same repetitions, then on until two in a row
# agree within GPU_SETTLED (the clocks are past their ramp from idle), GPU_WARMUP_MAX_S at most.
GPU_WARMUP_S = 0.025
GPU_SETTLED = 0.02
GPU_WARMUP_MAX_S = 0.5
BYTES_PER_FLOAT32 = 4
WORK = (
    f"median of {REPETITIONS} repetitions: CPU: {CPU_GEMMS} x fp32 GEMM {CPU_GEMM_SIZE}^2, "
    f"{MEMORY_COPIES} x copy of {MEMORY_BYTES // 2**20} MiB; CUDA: {GPU_GEMMS} x fp16 GEMM "
    f"{GPU_GEMM_SIZE}^2 after a warm-up of {GPU_WARMUP_S * 1e3:g} ms or more, until two in a row "
    f"agree within {GPU_SETTLED:.0%}"
)
