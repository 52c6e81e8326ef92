# SPDX-License-Identifier: MIT
#
# tests/data/hf-tiny/make.py: how the fixture beside it was made, by
# transformers itself: a tiny LlamaForCausalLM with Phi-3-mini's vocabulary
# (32064 ids: tests/data/tokenizers/phi3-mini's tokenizer), initialised
# from seed 0 as transformers initialises it, saved with save_pretrained in
# bfloat16 in shards of at most 200 kB (model-0000k-of-0000n.safetensors
# and model.safetensors.index.json, as every Hub model of 1B and up is).
# The tests copy the tokenizer files beside it.  Needs transformers and
# torch from PyPI (never the test suite's): run it in a bench venv,
#   VENV/bin/python tests/data/hf-tiny/make.py tests/data/hf-tiny
import sys

import torch
import transformers

out = sys.argv[1]
torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=32064, hidden_size=8, intermediate_size=24,
    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
    max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
    tie_word_embeddings=True, bos_token_id=1, eos_token_id=32000,
    initializer_range=0.02)
model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(out, max_shard_size="200kB", safe_serialization=True)
print("transformers", transformers.__version__, "torch", torch.__version__)
