#!/usr/bin/env bash
# Grow the embedded model's drafter training data: every prompt source, then the sources built
# on its answers (self-instruct on the questions it wrote, tasks on the reports it wrote, its
# sentences into German and back, follow-ups on every answer).
#
#     benchmarks/grow_training_data.sh DIR [SCALE] [TEMPERATURE]
#
# SCALE multiplies every source's token target (1 = about 1.5M response tokens in all, roughly
# an hour of this 2-core machine at ~400-800 tok/s). Rerun with a larger SCALE to grow the same
# directory: each step carries on where it stands (Ctrl+C keeps what finished). Run it under
# `nice -n 19` to give the machine back to anything else that needs it.
set -euo pipefail
dir=${1:?usage: grow_training_data.sh DIR [SCALE] [TEMPERATURE]}
scale=${2:-1}
temperature=${3:-0}
verispec=${VERISPEC:-.venv/bin/verispec}
grow() {  # SOURCE TOKENS
  "$verispec" train-data grow "$dir" --source "$1" --tokens "$(python3 -c "print(int($2 * $scale))")" \
    --temperature "$temperature" --max-new-tokens 256
}
grow templates 150000
grow passages 150000
grow code 150000
grow math 100000
grow roleplay 60000
grow questions 40000      # short: each answer is one question the target asks itself
grow self-instruct 150000
grow reports 200000
grow report-tasks 150000
grow german 60000         # one per answer: short, so this takes all there are
grow de-en 30000          # one per German answer that reads as German
grow follow-ups 300000
"$verispec" train-data show "$dir"
