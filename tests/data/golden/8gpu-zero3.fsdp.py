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

# The optimizer, its schedule and clipping, as stowage plans the run:
# AdamW, weight decay on the tensors of 2+ dimensions (all with DECAY_ALL);
# step k at LR k / WARMUP_STEPS during the warmup, then LR_SCHEDULE from LR to
# MIN_LR at TOTAL_STEPS.
import math

LR = 0.001
MIN_LR = 0.0
WARMUP_STEPS = 0
TOTAL_STEPS = 0  # not set (--steps)
LR_SCHEDULE = "constant"
BETAS = (0.9, 0.999)
EPS = 1e-08
WEIGHT_DECAY = 0.01
DECAY_ALL = False
MAX_GRAD_NORM = 1.0  # 0: no clipping

def make_optimizer(model):
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if DECAY_ALL or p.ndim >= 2]
    rest = [p for p in params if not (DECAY_ALL or p.ndim >= 2)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY},
         {"params": rest, "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS)

def lr_at(step):  # the 1-based optimizer step
    if WARMUP_STEPS and step <= WARMUP_STEPS:
        return LR * step / WARMUP_STEPS
    if LR_SCHEDULE == "constant":
        return LR
    frac = min(1.0, (step - WARMUP_STEPS) / max(1, TOTAL_STEPS - WARMUP_STEPS))
    k = 0.5 * (1 + math.cos(math.pi * frac)) if LR_SCHEDULE == "cosine" else 1 - frac
    return MIN_LR + (LR - MIN_LR) * k

def make_scheduler(optimizer):
    # LambdaLR's n (0 until the first scheduler.step()) sets the lr of step n + 1.
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda n: lr_at(n + 1) / LR if LR else 0.0)

# Each step, after the backward of its micro-batches:
#   if MAX_GRAD_NORM > 0:
#       torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)  # FSDP1: model.clip_grad_norm_(MAX_GRAD_NORM)
#   optimizer.step(); scheduler.step(); optimizer.zero_grad()
