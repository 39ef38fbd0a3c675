# W1-200 offline, our engine only: max_num_seqs x max_num_batched_tokens, alternated process by process, twice.
# bash docs/benchmarks/isa/session28/ab_seqs_budget.sh > docs/benchmarks/isa/session28/ab_seqs_budget.txt
cd "$(dirname "$0")/../../../.."
for round in 1 2; do
  for v in "128 1024" "256 1024" "256 2048" "128 2048"; do
    set -- $v
    echo "round $round: max_num_seqs $1, budget $2 ($(date -u +%H:%M:%S))"
    SEQS=$1 BUDGET=$2 python docs/benchmarks/isa/session28/step_split.py 200 2>&1 | grep -v INFO | head -3
  done
done
