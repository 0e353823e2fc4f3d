#!/usr/bin/env bash
source .gpu/preamble.sh
W="python3 -m webdrift"
timeout 200 $W bench --synthetic llama-3.2-1b,llama-3.1-8b --quant q4 --protocol 1024/128,4096/128 --no-peers --json $OUT/r5.json > $OUT/r5.txt 2>&1; echo "bench rc $?"
grep -v "^\s*$" $OUT/r5.txt | grep -E "^  [0-9]|loading" | cut -c1-140
timeout 100 $W profile --synthetic llama-3.1-8b --quant q4 --prompt-tokens 1024 --new-tokens 32 --json $OUT/prof_8b_q4.json > $OUT/prof_8b_q4.txt 2>&1; echo "prof rc $?"
sed -n '/GPU decode (timestamps)/,$p' $OUT/prof_8b_q4.txt | head -12
cp ~/.cache/webdrift/autotune/kernel_choices_v2.json $OUT/
