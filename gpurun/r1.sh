#!/usr/bin/env bash
# GPU run 1 (session 6): baseline of the session-5 features on main
source .gpu/preamble.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
date -u
W="python3 -m webdrift"
timeout 300 $W bench --synthetic llama-3.2-1b --quant q4,f16 --protocol 1024/128 --no-peers --streams 4,8 --lora-rank 16 --json $OUT/r1_1b.json > $OUT/r1_1b.txt 2>&1; echo "bench rc $?"
tail -30 $OUT/r1_1b.txt
date -u
timeout 120 $W profile --synthetic llama-3.2-1b --quant f16 --prompt-tokens 1024 --new-tokens 64 --json $OUT/prof_1b_f16.json > $OUT/prof_1b_f16.txt 2>&1; echo "prof rc $?"
head -70 $OUT/prof_1b_f16.txt
date -u
