# PyTorch FSDP for llama-13b on 8xA100-80GB (dp 8, ZeRO 3), written by stowage.
# Micro-batch 1 per GPU, 1 accumulation steps: 8 sequences per step.
import torch
from torch.distributed.device_mesh import init_device_mesh

MICRO_BATCH_SIZE = 1
GRADIENT_ACCUMULATION_STEPS = 1
ACTIVATION_CHECKPOINTING = False

# FSDP2 (torch >= 2.6): fully_shard each transformer block, then the root module.
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy, CPUOffloadPolicy, OffloadPolicy

mesh = init_device_mesh("cuda", (8,), mesh_dim_names=("shard",))
FSDP2_KWARGS = dict(
    mesh=mesh,
    reshard_after_forward=True,
    mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    offload_policy=OffloadPolicy(),
)

# FSDP1 equivalent: FullyShardedDataParallel(model, **FSDP1_KWARGS)
from torch.distributed.fsdp import (BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy)

FSDP1_KWARGS = dict(
    sharding_strategy=ShardingStrategy.FULL_SHARD,
    cpu_offload=CPUOffload(offload_params=False),
    mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16),
    backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
    limit_all_gathers=True,
    use_orig_params=True,
)
