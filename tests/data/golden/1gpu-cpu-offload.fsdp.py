exit 2
stowage: --engine fsdp has no ZeRO-1 strategy (NO_SHARD, SHARD_GRAD_OP, FULL_SHARD)
