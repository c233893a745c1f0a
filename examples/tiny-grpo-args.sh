# GRPO on the embedded tiny model: the flag groups the run-tiny-*.sh examples share, in the shape of
# slime's scripts/run-*.sh. Sourced, not run. Paths and sizes come from the environment:
#   TINY        what `slime-ref make-tiny --out DIR` wrote (model/, data/)       default ./slime-tiny
#   OUT         where checkpoints and run outputs go                              default ./slime-tiny-runs
#   WARM        the warm-up checkpoint from run-tiny-sft-warmup.sh (Megatron format)
#   NUM_ROLLOUT how many rollout -> train steps                                   default 60
#   RUN_NAME    the run's folder under OUT                                        default grpo
#   MAX_RESPONSE_LEN  tokens per response                                          default 8

TINY=${TINY:-./slime-tiny}
OUT=${OUT:-./slime-tiny-runs}
WARM=${WARM:-${OUT}/sft}
NUM_ROLLOUT=${NUM_ROLLOUT:-60}
RUN_NAME=${RUN_NAME:-grpo}
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-8}

CKPT_ARGS=(
   # tokenizer and the engines' architecture; the engines get the trained weights before rollout 0
   --hf-checkpoint ${TINY}/model
   # the reference model, and the actor's starting point while --load holds no checkpoint yet
   --ref-load ${WARM}
   # resume from here: --load equal to --save
   --load ${OUT}/${RUN_NAME}
   --save ${OUT}/${RUN_NAME}
   --save-interval 20
)

ROLLOUT_ARGS=(
   --prompt-data ${TINY}/data/train.jsonl
   --input-key prompt
   --label-key label
   --apply-chat-template
   --rollout-shuffle
   --num-rollout ${NUM_ROLLOUT}
   # 8 prompts x 8 samples = 64 samples = one optimizer step of 64 (the batch identity)
   --rollout-batch-size 8
   --n-samples-per-prompt 8
   --global-batch-size 64
   --rollout-max-response-len ${MAX_RESPONSE_LEN}
   --rollout-temperature 1.0
)

REWARD_ARGS=(
   # slime's built-in math rule: grades the last \boxed{...} answer; unboxed answers score 0
   --rm-type math
)

EVAL_ARGS=(
   --eval-interval 20
   --eval-prompt-data arith ${TINY}/data/eval.jsonl
   --n-samples-per-eval-prompt 4
)

GRPO_ARGS=(
   --advantage-estimator grpo
   --eps-clip 0.2
   --eps-clip-high 0.28
   --entropy-coef 0.0
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr 5e-4
   --lr-decay-style constant
   --weight-decay 0.0
   --adam-beta1 0.9
   --adam-beta2 0.98
)

PERF_ARGS=(
   --use-dynamic-batch-size
   --max-tokens-per-gpu 2048
)

RESOURCE_ARGS=(
   # one device, shared by the trainer and the engine
   --actor-num-nodes 1
   --actor-num-gpus-per-node 1
   --colocate
   --num-gpus-per-node 1
   --rollout-num-gpus-per-engine 1
   --sglang-mem-fraction-static 0.5
)

MISC_ARGS=(
   # Megatron's default dropout is 0.1; RL compares log-probs across passes, so turn it off
   --attention-dropout 0.0
   --hidden-dropout 0.0
)
