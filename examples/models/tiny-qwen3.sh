# Megatron architecture flags for the embedded tiny Qwen3 (`slime-ref make-tiny`), in the shape of
# slime's scripts/models/*.sh. They must match DIR/model/config.json: slime compares hidden size,
# heads, layers, FFN size, tied embeddings, RMSNorm epsilon and rotary base before training.
MODEL_ARGS=(
   --swiglu
   --num-layers 2
   --hidden-size 128
   --ffn-hidden-size 384
   --num-attention-heads 4
   --group-query-attention
   --num-query-groups 2
   --kv-channels 32
   --use-rotary-position-embeddings
   --disable-bias-linear
   --normalization "RMSNorm"
   --norm-epsilon 1e-6
   --rotary-base 10000
   --vocab-size 128
   --qk-layernorm
   # config.json has "tie_word_embeddings": false
   --untie-embeddings-and-output-weights
)
