#!/usr/bin/env bash
# GPU run 2: the tuner with the L2 flush; q4 profile
source .gpu/preamble.sh
W="python3 -m webdrift"
date -u
timeout 280 $W bench --synthetic llama-3.2-1b,llama-3.1-8b --quant q4,f16 --protocol 1024/128 --no-peers --streams 4,8 --json $OUT/r2.json > $OUT/r2.txt 2>&1; echo "bench rc $?"
grep -v "^\s*$" $OUT/r2.txt | tail -14 | cut -c1-140
date -u
timeout 100 $W profile --synthetic llama-3.2-1b --quant q4 --prompt-tokens 1024 --new-tokens 64 --json $OUT/prof_1b_q4.json > $OUT/prof_1b_q4.txt 2>&1; echo "prof rc $?"
sed -n '/GPU decode (timestamps)/,$p' $OUT/prof_1b_q4.txt
cp ~/.cache/webdrift/autotune/kernel_choices_v2.json $OUT/ 2>/dev/null || find / -name "kernel_choices_v2.json" 2>/dev/null | head -2
date -u
