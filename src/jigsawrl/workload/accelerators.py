"""Accelerator presets: the hardware constants the cost model reads.

Every constant names its public source. Peak FLOP/s is *dense* bf16 (no sparsity), the figure
that MFU is conventionally measured against. Prices are on-demand list prices per accelerator-hour
from public cloud price pages in 2025; they vary by provider and region, are used only for the
"cost per million tokens" column, and can be overridden with ``cluster.price_per_hour``.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
TB = 1e12


@dataclass(frozen=True, slots=True)
class AcceleratorSpec:
    """One accelerator (one GPU) as the cost model sees it."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bytes: float  # device memory
    hbm_bytes_per_s: float  # device memory bandwidth
    host_link_bytes_per_s: float  # host <-> device (PCIe), per device, one direction
    intra_node_bytes_per_s: float  # device <-> device in a node (NVLink), per device, one direction
    inter_node_bytes_per_s: float  # per device across nodes (InfiniBand NIC share)
    sm_count: int
    price_per_hour_usd: float
    source: str


ACCELERATORS: dict[str, AcceleratorSpec] = {
    "h100-80gb": AcceleratorSpec(
        name="h100-80gb",
        peak_flops=989e12,  # NVIDIA H100 SXM datasheet: 989 TFLOPS bf16 dense (1979 with sparsity)
        hbm_bytes=80 * GB,  # datasheet: 80 GB HBM3
        hbm_bytes_per_s=3.35 * TB,  # datasheet: 3.35 TB/s
        host_link_bytes_per_s=55 * GB,  # PCIe Gen5 x16: 64 GB/s raw, ~55 GB/s achievable
        intra_node_bytes_per_s=450 * GB,  # NVLink 4: 900 GB/s bidirectional per GPU
        inter_node_bytes_per_s=50 * GB,  # one 400 Gb/s ConnectX-7 NIC per GPU (DGX H100)
        sm_count=132,  # datasheet (SXM5)
        price_per_hour_usd=2.99,  # Lambda on-demand 8x H100 SXM, per GPU-hour, 2025
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5); DGX H100 user guide",
    ),
    "a100-80gb": AcceleratorSpec(
        name="a100-80gb",
        peak_flops=312e12,  # NVIDIA A100 datasheet: 312 TFLOPS bf16 dense
        hbm_bytes=80 * GB,  # datasheet: 80 GB HBM2e
        hbm_bytes_per_s=2.039 * TB,  # datasheet (SXM 80GB): 2,039 GB/s
        host_link_bytes_per_s=25 * GB,  # PCIe Gen4 x16: 32 GB/s raw, ~25 GB/s achievable
        intra_node_bytes_per_s=300 * GB,  # NVLink 3: 600 GB/s bidirectional per GPU
        inter_node_bytes_per_s=25 * GB,  # one 200 Gb/s HDR NIC per GPU (DGX A100)
        sm_count=108,  # datasheet
        price_per_hour_usd=1.79,  # Lambda on-demand A100 SXM 80GB, per GPU-hour, 2025
        source="NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB); DGX A100 user guide",
    ),
    "h200-141gb": AcceleratorSpec(
        name="h200-141gb",
        peak_flops=989e12,  # NVIDIA H200 SXM datasheet: 989 TFLOPS bf16 dense (same die as H100)
        hbm_bytes=141 * GB,  # datasheet: 141 GB HBM3e
        hbm_bytes_per_s=4.8 * TB,  # datasheet: 4.8 TB/s
        host_link_bytes_per_s=55 * GB,  # PCIe Gen5 x16, as H100
        intra_node_bytes_per_s=450 * GB,  # NVLink 4: 900 GB/s bidirectional per GPU
        inter_node_bytes_per_s=50 * GB,  # 400 Gb/s NIC per GPU (HGX H200 reference)
        sm_count=132,  # datasheet (SXM)
        price_per_hour_usd=3.79,  # on-demand H200 SXM per GPU-hour, public cloud lists, 2025
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM)",
    ),
}
