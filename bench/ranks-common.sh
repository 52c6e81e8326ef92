# SPDX-License-Identifier: MIT
#
# bench/ranks-common.sh: what bench/ranks.sh and bench/reduction-drift.sh
# share, sourced from the repository's root: mpirun's flags, OpenMP's
# passive waits, and the jobs' small model and data.  Runs nothing itself.

root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
# Every run waits passively in OpenMP, as several ranks on one node do by
# themselves (cli/cmd-train.c): on a shared machine the spinning default
# makes one rank the slower by an order of magnitude.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# small_model STOWAGE DIR LAYERS: a LLaMA of hidden 64 and LAYERS layers
# with Phi-3-mini's vocabulary (32,064) and tokenizer
# (../shared/data/tokenizers, or $STOW_TOKENIZER), initialised (seed 7)
# into DIR.
small_model () {
  local cfg="$2.json"
  cat >"$cfg" <<J
{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":64,
 "head_dim":16,"num_attention_heads":4,"num_key_value_heads":2,
 "intermediate_size":176,"num_hidden_layers":$3,"vocab_size":32064,
 "max_position_embeddings":512,"rms_norm_eps":1e-5,"rope_theta":10000.0,
 "tie_word_embeddings":false,"initializer_range":0.02,"bos_token_id":1,
 "eos_token_id":32000}
J
  "$1" init-model "$cfg" -o "$2" --seed 7 >/dev/null
  cp "${STOW_TOKENIZER:-../shared/data/tokenizers/phi3-mini.tokenizer.json}" \
      "$2/tokenizer.json"
}

# prompt_lines FILE: 6,000 prompt/completion lines, as the README's quick
# start writes them.
prompt_lines () {
  local i
  for i in $(seq 1 6000); do
    echo "{\"prompt\": \"How many GPUs does run $i use?\", \"completion\": \" Run $i uses $((i % 8 + 1)) GPUs.\"}"
  done >"$1"
}

# job_files BUILD NAME LAYERS: sets S (BUILD's stowage) and W (a directory
# /tmp/stow-NAME-*, removed when the script exits) holding model/
# (small_model, LAYERS layers) and train.jsonl (prompt_lines).
job_files () {
  S=$PWD/$1/cli/stowage
  W=$(mktemp -d "/tmp/stow-$2-XXXXXX")
  trap 'rm -rf "$W"' EXIT
  small_model "$S" "$W/model" "$3"
  prompt_lines "$W/train.jsonl"
}
