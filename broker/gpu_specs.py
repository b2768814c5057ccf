"""Published per-GPU specs the throughput model scales from, keyed by the catalog's GPU names.

Figures are per GPU as clouds count them (a K80 board is two GPUs). Dense figures only:
NVIDIA's "with sparsity" numbers are halved back.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """Peak figures of one GPU: FP32 and FP16 tensor TFLOPs, memory GB/s and GB."""

    fp32_tflops: float
    fp16_tensor_tflops: float
    mem_bandwidth_gbps: float
    mem_gb: float
    cuda: bool = True


GPU_SPECS: dict[str, GpuSpec] = {
    # NVIDIA Tesla K80 datasheet: board 8.73 TF FP32 (boost), 480 GB/s, 24 GB over two
    # GK210 GPUs; halved. No fast FP16.
    "K80": GpuSpec(4.37, 4.37, 240.0, 12.0),
    # NVIDIA Tesla P100 PCIe datasheet (16 GB, the cloud variant): 9.3 / 18.7 TF, 732 GB/s.
    "P100": GpuSpec(9.3, 18.7, 732.0, 16.0),
    # NVIDIA Tesla V100 datasheet, SXM2 (AWS p3, GCP): 15.7 TF FP32, 125 TF tensor, 900 GB/s.
    "V100": GpuSpec(15.7, 125.0, 900.0, 16.0),
    # Same datasheet, V100 SXM2 32 GB (AWS p3dn).
    "V100-32GB": GpuSpec(15.7, 125.0, 900.0, 32.0),
    # NVIDIA T4 datasheet: 8.1 TF FP32, 65 TF FP16 mixed precision, 320 GB/s, 16 GB.
    "T4": GpuSpec(8.1, 65.0, 320.0, 16.0),
    # AWS g5g (Graviton2 + T4G): the same T4 silicon, so the T4 figures.
    "T4g": GpuSpec(8.1, 65.0, 320.0, 16.0),
    # NVIDIA publishes no A10G sheet; Baseten's "NVIDIA A10 vs A10G" spec table (from AWS):
    # 35 TF FP32, 70 TF tensor, 600 GB/s, 24 GB (A10 datasheet: 31.2 / 125 TF, 600 GB/s).
    "A10G": GpuSpec(35.0, 70.0, 600.0, 24.0),
    # NVIDIA L4 datasheet: 30.3 TF FP32, 242 TF FP16 with sparsity, 300 GB/s, 24 GB.
    "L4": GpuSpec(30.3, 121.0, 300.0, 24.0),
    # NVIDIA L40S datasheet: 91.6 TF FP32, 733 TF FP16 with sparsity, 864 GB/s, 48 GB.
    "L40S": GpuSpec(91.6, 366.0, 864.0, 48.0),
    # NVIDIA A100 datasheet, 40 GB SXM4: 19.5 TF FP32, 312 TF FP16 tensor, 1555 GB/s.
    "A100": GpuSpec(19.5, 312.0, 1555.0, 40.0),
    # Same datasheet, 80 GB SXM4: 2039 GB/s.
    "A100-80GB": GpuSpec(19.5, 312.0, 2039.0, 80.0),
    # NVIDIA H100 datasheet, SXM5 (AWS p5, GCP a3): 67 TF FP32, 1979 TF FP16 sparse,
    # 3.35 TB/s, 80 GB.
    "H100": GpuSpec(67.0, 989.5, 3350.0, 80.0),
    # NVIDIA H200 datasheet, SXM: H100 compute, 4.8 TB/s, 141 GB.
    "H200": GpuSpec(67.0, 989.5, 4800.0, 141.0),
    # NVIDIA Tesla P4 datasheet: 5.5 TF FP32 (no fast FP16), 192 GB/s, 8 GB.
    "P4": GpuSpec(5.5, 5.5, 192.0, 8.0),
    # AMD Radeon Pro V520 product page (AWS g4ad): 7.4 TF FP32, 14.7 TF FP16, 512 GB/s HBM2,
    # 8 GB. Not CUDA: the CUDA training models do not run on it.
    "Radeon Pro V520": GpuSpec(7.4, 14.7, 512.0, 8.0, cuda=False),
}

# Names in the Gavel measurements -> catalog names.
MEASURED_GPUS: dict[str, str] = {"k80": "K80", "p100": "P100", "v100": "V100"}
