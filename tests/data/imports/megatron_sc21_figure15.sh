#!/bin/bash
# Test fixture: one case of the SC21 paper's Figure 15 (Narayanan et al. 2021) as Megatron-LM ran it,
# its three files folded into one by hand:
#   NVIDIA/Megatron-LM examples/academic_paper_scripts/sc21/run_figure_15.sh @ d086a2e3b020ff78db9d29915f7cfe886e085f13
#     (TP=2, GBS=32, DP=$((64/TP)), PP=1, MBS=1, NLS=32, HS=3840, NAH=32, DDP=local, NNODES=8)
#   .../sc21/CONFIG.sh @ 1916693cfe5df54774b0f2c0ea059e6dc1d7a0aa   (MEGATRON_PARAMS)
#   .../sc21/SRUN.sh   @ 157006d6d9bf4f55c0d4d7dacbd2b65e7bd84dc9   (#SBATCH --ntasks-per-node=8, srun ... sh -c)
# The nodes come from the job allocation (sbatch -N $NNODES in SBATCH.sh), written here as #SBATCH.
#SBATCH --nodes=8
#SBATCH -t 0:30:00 --exclusive --mem=0 --overcommit --ntasks-per-node=8

TP=2
GBS=32
DP=$((64/TP))
PP=1
MBS=1
NLS=32
HS=3840
NAH=32
DDP=local
MEGATRON_EXTRA_PARAMS="--activations-checkpoint-method uniform "
NNODES=8

export MEGATRON_PARAMS=" ${MEGATRON_EXTRA_PARAMS} \
	--tensor-model-parallel-size ${TP} \
	--pipeline-model-parallel-size ${PP} \
	--micro-batch-size ${MBS} \
	--global-batch-size ${GBS} \
        --num-layers ${NLS} \
        --hidden-size ${HS} \
        --num-attention-heads ${NAH} \
	--DDP-impl ${DDP} \
	--data-path ${MEGATRON_DATA} \
	--vocab-file ${BPE_VOCAB_FILE} \
	--merge-file ${BPE_MERGE_FILE} \
        --log-interval 5 \
        --seq-length 2048 \
        --max-position-embeddings 2048 \
        --train-iters 500 \
        --lr-decay-iters 320 \
        --lr 0.0001 \
	--min-lr 0.00001 \
        --lr-decay-style cosine \
        --lr-warmup-fraction 0.01 \
        --split 969,30,1 \
        --eval-iters 100 \
        --eval-interval 1000 \
        --clip-grad 1.0 \
        --fp16 \
	--loss-scale 8192 "

THIS_DIR=`pwd`
CMD="python -u ${MEGATRON_CODE_DIR}/pretrain_gpt.py ${MEGATRON_PARAMS}"

srun -l \
     --container-image "nvcr.io#nvidia/pytorch:20.12-py3" \
     --container-mounts "${THIS_DIR}:${THIS_DIR},${MEGATRON_CODE_DIR}:${MEGATRON_CODE_DIR}" \
     --output=${THIS_DIR}/logs/%x_%j.log sh -c "${CMD}"
