exit 2
stowage: --emit fsdp: FSDP shards data-parallel ranks only; tp 8 pp 4 cp 1 ep 1 need a composed setup (e.g. torchtitan) or --emit megatron
