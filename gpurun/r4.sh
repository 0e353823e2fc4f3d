#!/usr/bin/env bash
source .gpu/preamble.sh
W="python3 -m webdrift"
date -u
timeout 250 $W bench --synthetic llama-3.2-1b,llama-3.1-8b --quant q4,f16 --protocol 1024/128 --no-peers --json $OUT/r4.json > $OUT/r4.txt 2>&1; echo "bench rc $?"
grep -v "^\s*$" $OUT/r4.txt | grep -E "^  [0-9]|loading" | cut -c1-140
for q in q4; do
timeout 100 $W profile --synthetic llama-3.1-8b --quant $q --prompt-tokens 1024 --new-tokens 32 --json $OUT/prof_8b_$q.json > $OUT/prof_8b_$q.txt 2>&1; echo "prof rc $?"
sed -n '/GPU decode (timestamps)/,$p' $OUT/prof_8b_$q.txt
done
cp ~/.cache/webdrift/autotune/kernel_choices_v2.json $OUT/
date -u
