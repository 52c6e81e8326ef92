exit 2
stowage: --emit fsdp: FSDP has no ZeRO-1 strategy (NO_SHARD, SHARD_GRAD_OP, FULL_SHARD)
