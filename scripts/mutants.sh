#!/usr/bin/env bash
# Mutation score: how good the checks are. Plants one small bug at a time in the Lua scripts
# (src/raw/lua/*.lua; the operators are listed in tools/lua_mutants.py: flipped comparisons,
# off-by-ones, deleted writes, TTLs, guards and calls, conditions forced true or false, changed
# reply strings) and runs the checks on each: the protocol tests and the fuzzer's short mode.
# A mutant is killed when a check fails (or hangs past its timeout: "timeout"), survived when
# all pass, invalid when the mutated scripts no longer load into Redis, equivalent when scripts/mutants-equivalent.txt says it cannot change behaviour (not
# run). Score = (killed + timeout) / (all - invalid - equivalent). See docs/evidence.md.
#
#   scripts/mutants.sh --list [selection]      the mutants (id, sig, file:line, operator, change)
#   scripts/mutants.sh [options] [selection]   run them (all of them when nothing is selected)
#   selection: ID or ID-ID (the numbers of --list), --file acquire.lua (repeatable),
#              --sample N [--seed S] (N mutants spread over the files, default seed 1)
#   --tests a,b,c     the checks (suites of the integration binary tests/it, each run by its
#                     module's tests; default fuzz, protocol, semaphore_protocol, in the order
#                     most likely to fail first for the mutated file)
#   --all-checks      run every check on every mutant (which ones kill it), not only up to the
#                     first that fails
#   --timeout SECS    per check (default: 3x its time in the baseline run, at least 60 s)
#   --no-baseline     skip the run without a mutant (default timeout then 180 s)
#   --summary         print the score and survivors of the last run's results again
#   --rust [--file src/x.rs]... [-- cargo-mutants args]
#                     cargo-mutants (`cargo install cargo-mutants --locked`) over the client's
#                     decision code (src/acquire/engine.rs, lease_estimate.rs, background/waker.rs,
#                     background/watchdog.rs) with the same checks (`--tests lib,...` adds the unit
#                     tests in src/, by their `tests::` modules); e.g. `-- --shard 1/100`
#
# Everything runs in a scratch copy of the tree (target/mutants/tree, debug build in
# target/mutants/target; the first run builds the dependencies there once): the working tree is
# never touched. The checks are built once, with `--cfg fairlock_mutants`: they then read the Lua
# from the scratch copy at run time (FAIRLOCK_LUA_DIR, src/raw/scripts.rs), so a mutant costs its
# checks' time and no build. Results: target/mutants/results.tsv (one row per mutant), logs in
# target/mutants/logs/. Long: about 20-40 s per mutant on 2 cores; not part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ROOT=$PWD
OUT=$ROOT/target/mutants
TREE=$OUT/tree
export CARGO_TARGET_DIR=$OUT/target
EQUIVALENT=$ROOT/scripts/mutants-equivalent.txt
GEN=(python3 "$ROOT/tools/lua_mutants.py")
RUST_FILES=(src/acquire/engine.rs src/lease_estimate.rs src/background/waker.rs src/background/watchdog.rs)

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

list=0 summary_only=0 rust=0 all_checks=0 baseline=1 timeout="" tests="" sample="" seed=1
files=() ids=() passthrough=()
while [ $# -gt 0 ]; do
  case "$1" in
    --list) list=1 ;;
    --summary) summary_only=1 ;;
    --rust) rust=1 ;;
    --all-checks) all_checks=1 ;;
    --no-baseline) baseline=0 ;;
    --timeout) timeout=${2:?--timeout SECS}; shift; require_count "$timeout" "--timeout SECS" ;;
    --tests) tests=${2:?--tests a,b,c}; shift ;;
    --sample) sample=${2:?--sample N}; shift; require_count "$sample" "--sample N" ;;
    --seed) seed=${2:?--seed S}; shift; require_count "$seed" "--seed S" ;;
    --file) files+=("${2:?--file NAME}"); shift ;;
    --) shift; passthrough=("$@"); break ;;
    -h|--help) usage ;;
    [0-9]*) [[ "$1" =~ ^[0-9]+(-[0-9]+)?$ ]] || usage; ids+=("$1") ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
  shift
done

# One run at a time: both modes use the scratch copy.
one_run_at_a_time() {
  mkdir -p "$OUT"
  exec 9>"$OUT/lock"
  flock -n 9 || { echo "another scripts/mutants.sh run is under way ($OUT/lock)" >&2; exit 2; }
}

# The scratch copy: the tracked and untracked (not ignored) files of the working tree, as they
# are now (fresh modification times: cargo rebuilds what changed since the last run).
refresh_tree() {
  rm -rf "$TREE"
  mkdir -p "$TREE"
  git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$TREE"
}

# summary RESULTS: the score per file and in total, and the survivors, of a results file
summary() {
  local results=$1
  echo "== mutation score (per file; timeout counts as killed; equivalent and invalid left out)"
  awk -F'\t' -v files="$(tail -n +2 "$results" | cut -f3 | sort -u | tr '\n' ' ')" '
    NR == 1 { next }
    { c[$3, $8]++; c["TOTAL", $8]++; all[$3]++; all["TOTAL"]++;
      if ($8 != "equivalent") { ran++; secs += $10 } }
    function row(k,   kill, base) {
      kill = c[k, "killed"] + c[k, "timeout"]
      base = all[k] - c[k, "invalid"] - c[k, "equivalent"]
      printf "%-20s %6d %7d %8d %8d %7d %10d   %s\n", k, all[k], c[k, "killed"], c[k, "timeout"],
        c[k, "survived"], c[k, "invalid"], c[k, "equivalent"],
        (base > 0 ? sprintf("%.0f%% (%d/%d)", 100 * kill / base, kill, base) : "-")
    }
    END {
      printf "%-20s %6s %7s %8s %8s %7s %10s   %s\n", "file", "all", "killed", "timeout",
        "survived", "invalid", "equivalent", "score"
      n = split(files, names, " ")
      for (i = 1; i <= n; i++) row(names[i])
      row("TOTAL")
      if (ran > 0) printf "%d mutants run in %ds, %.0fs per mutant\n", ran, secs, (secs / ran)
    }' "$results"
  if grep -q $'\tsurvived\t' "$results"; then
    echo "== survivors (review: equivalent -> scripts/mutants-equivalent.txt, else a gap in the checks)"
    awk -F'\t' '$8 == "survived" { printf "%4d %s %s:%s %s\n       %s\n    -> %s\n", $1, $2, $3, $4,
      $5, $6, ($7 == "" ? "(removed)" : $7) }' "$results"
  fi
}

if [ "$summary_only" = 1 ]; then
  [ -f "$OUT/results.tsv" ] || { echo "no $OUT/results.tsv yet" >&2; exit 2; }
  summary "$OUT/results.tsv"
  exit 0
fi

# ---- cargo-mutants over the client's Rust ---------------------------------------------------

if [ "$rust" = 1 ]; then
  if ! cargo mutants --version >/dev/null 2>&1; then
    echo "cargo-mutants is not installed: cargo install cargo-mutants --locked" >&2
    exit 2
  fi
  ensure_test_tools
  [ ${#files[@]} -gt 0 ] || files=("${RUST_FILES[@]}")
  args=(--all-features --output "$OUT/rust")
  for f in "${files[@]}"; do args+=(--file "$f"); done
  if [ "$list" = 1 ]; then
    cargo mutants --list "${args[@]}" "${passthrough[@]}"
    exit 0
  fi
  [ -z "$timeout" ] || args+=(--timeout "$timeout")
  IFS=, read -r -a checks <<<"${tests:-protocol,semaphore_protocol,fuzz}"
  # one integration binary: a check is a module filter (the unit tests: their tests:: modules)
  test_args=(--test it) filters=()
  for c in "${checks[@]}"; do
    if [ "$c" = lib ]; then
      test_args+=(--lib)
      filters+=(tests::)
    else
      filters+=("$c::")
    fi
  done
  test_args+=(-- "${filters[@]}")
  one_run_at_a_time
  refresh_tree
  # the mutants are made in the scratch copy (--in-place there), never in the working tree
  echo "== cargo-mutants over ${files[*]} with ${checks[*]} (in $TREE)"
  (cd "$TREE" && FAIRLOCK_FUZZ_FAIL_FAST=1 FAIRLOCK_FUZZ_SECONDS=${FAIRLOCK_FUZZ_SECONDS:-40} nice -n 10 cargo mutants --in-place "${args[@]}" "${passthrough[@]}" \
    -- "${test_args[@]}")
  exit $?
fi

# ---- the Lua mutants ------------------------------------------------------------------------

select_args=(--equivalent "$EQUIVALENT")
for f in "${files[@]}"; do select_args+=(--file "$f"); done
[ -z "$sample" ] || select_args+=(--sample "$sample" --seed "$seed")
select_args+=("${ids[@]}")
mkdir -p "$OUT"
"${GEN[@]}" list "${select_args[@]}" >"$OUT/selected.tsv"
total=$(wc -l <"$OUT/selected.tsv")

if [ "$list" = 1 ]; then
  awk -F'\t' '{ printf "%4d %s %s:%s %s\n       %s\n    -> %s%s\n", $1, $2, $3, $4, $5, $6,
                 ($7 == "" ? "(removed)" : $7), ($8 == "" ? "" : "\n    equivalent: " $8) }' \
    "$OUT/selected.tsv"
  echo "$total mutants" >&2
  exit 0
fi
[ "$total" -gt 0 ] || { echo "no mutants selected" >&2; exit 2; }

# the checks for a mutant of file $1, the likeliest to fail first
checks_for() {
  if [ -n "$tests" ]; then
    echo "${tests//,/ }"
    return
  fi
  case "$1" in
    sem*.lua) echo "semaphore_protocol fuzz protocol" ;;
    common.lua|state.lua) echo "protocol semaphore_protocol fuzz" ;;
    *) echo "protocol fuzz semaphore_protocol" ;;
  esac
}
all_tests=$(checks_for "" | tr ' ' '\n' | sort -u | tr '\n' ' ')
[ -z "$tests" ] || all_tests=${tests//,/ }

ensure_test_tools
for t in timeout redis-cli; do
  command -v "$t" >/dev/null || { echo "$t is needed" >&2; exit 2; }
done

one_run_at_a_time
current_file=""   # the Lua file mutated in the scratch copy, restored on exit
check_pid=""      # the running check (a `timeout` process: it signals its whole group)
V_PID="" V_DIR=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$check_pid" ]; then
    kill -TERM "$check_pid" 2>/dev/null || true
    wait "$check_pid" 2>/dev/null || true
  fi
  if [ -n "$current_file" ]; then
    cp "$ROOT/src/raw/lua/$current_file" "$TREE/src/raw/lua/$current_file"
  fi
  [ -z "$V_PID" ] || stop_redis "$V_PID" "$V_DIR"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

refresh_tree
mkdir -p "$OUT/logs"
rm -f "$OUT"/logs/*.log

# a server to load each mutant's function library into: one that does not load is invalid
start_redis V
loads() {
  local reply
  reply=$("${GEN[@]}" library "$TREE/src/raw/lua" | redis-cli -p "$V_PORT" -x FUNCTION LOAD REPLACE)
  [ "$reply" = fairlock_mutant_check ] || { echo "$reply"; return 1; }
}
loads >/dev/null || { echo "the unmutated scripts do not load: $(loads)" >&2; exit 1; }

# the test-name filter of check $1: its module of tests/it (protocol's without its
# semaphore_protocol namesake, which the substring match would take too)
filter_of() {
  case "$1" in
    protocol) echo "protocol:: --skip semaphore_protocol::" ;;
    *) echo "$1::" ;;
  esac
}

# build the checks in the scratch copy (the integration binary); sets EXE[it]
declare -A EXE
build() {
  local log=$1
  (cd "$TREE" && RUSTFLAGS="--cfg fairlock_mutants" nice -n 10 cargo test --all-features --no-run \
    --message-format=json --test it) >"$log.json" 2>"$log" || return 1
  while read -r name exe; do EXE[$name]=$exe; done < <(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])' "$log.json")
  rm -f "$log.json"
}

# run_check NAME LOG LIMIT: 0 passed, 1 failed, 2 timed out
run_check() {
  local name=$1 log=$2 limit=$3 rc
  (cd "$TREE" && FAIRLOCK_FUZZ_FAIL_FAST=1 FAIRLOCK_FUZZ_SECONDS=${FAIRLOCK_FUZZ_SECONDS:-40} RUST_BACKTRACE=0 FAIRLOCK_LUA_DIR="$TREE/src/raw/lua" \
    exec nice -n 10 timeout -k 10 "$limit" "${EXE[it]}" -q $(filter_of "$name")) >"$log" 2>&1 &
  check_pid=$!
  if wait "$check_pid"; then rc=0; else rc=$?; fi
  check_pid=""
  case $rc in
    0) return 0 ;;
    124|137) return 2 ;;
    *) return 1 ;;
  esac
}

declare -A LIMIT
echo "== building the checks in $TREE (debug)"
build "$OUT/logs/build-baseline.log" || { echo "the tree does not build: $OUT/logs/build-baseline.log" >&2; exit 1; }
[ -n "${EXE[it]:-}" ] || { echo "no integration test binary (tests/it)" >&2; exit 1; }
for t in $all_tests; do
  LIMIT[$t]=${timeout:-180}
done
# The checks must run the scratch copy's Lua, not the compiled-in scripts: with a common.lua
# that does not compile, the first check must fail (else every mutant would "survive").
current_file=common.lua
echo 'this is not Lua' >>"$TREE/src/raw/lua/common.lua"
first_check=${all_tests%% *}
if run_check "$first_check" "$OUT/logs/self-test.log" 600; then
  echo "the checks do not read FAIRLOCK_LUA_DIR ($first_check passed with a broken common.lua)" >&2
  exit 1
fi
cp "$ROOT/src/raw/lua/common.lua" "$TREE/src/raw/lua/common.lua"
current_file=""
echo "   the checks read the mutated scripts (a broken common.lua fails $first_check)"
if [ "$baseline" = 1 ]; then
  echo "== baseline: the checks without a mutant must pass"
  for t in $all_tests; do
    began=$SECONDS
    if ! run_check "$t" "$OUT/logs/baseline-$t.log" 1800; then
      echo "   $t fails without a mutant: $OUT/logs/baseline-$t.log" >&2
      exit 1
    fi
    took=$((SECONDS - began))
    [ -n "$timeout" ] || LIMIT[$t]=$(( took * 3 > 60 ? took * 3 : 60 ))
    echo "   $t: passed in ${took}s (timeout per mutant ${LIMIT[$t]}s)"
  done
fi

results=$OUT/results.tsv
# the last run's results stay in results.prev.tsv
[ ! -s "$results" ] || mv "$results" "$OUT/results.prev.tsv"
printf 'id\tsig\tfile\tline\toperator\toriginal\tmutated\toutcome\tkilled_by\tseconds\n' >"$results"
echo "== $total mutants; results in $results"
n=0
# fields split at \037, not at tabs: IFS whitespace (a tab) would merge the empty field of a
# removed line with its neighbour and shift the equivalence reason into "mutated"
while IFS=$'\037' read -r id sig file line op original mutated why; do
  n=$((n + 1))
  began=$SECONDS
  outcome="" by=""
  if [ -n "$why" ]; then
    outcome=equivalent by="$why"
  else
    current_file=$file
    "${GEN[@]}" apply "$id" "$TREE/src/raw/lua" >/dev/null
    if ! err=$(loads); then
      outcome=invalid by="load: ${err//$'\t'/ }"
    else
      killers=()
      for t in $(checks_for "$file"); do
        if run_check "$t" "$OUT/logs/$id-$t.log" "${LIMIT[$t]}"; then
          rm -f "$OUT/logs/$id-$t.log"
          continue
        else
          rc=$?
        fi
        if [ "$rc" = 2 ]; then killers+=("timeout:$t"); else killers+=("$t"); fi
        [ "$all_checks" = 1 ] || break
      done
      if [ ${#killers[@]} -eq 0 ]; then
        outcome=survived
      elif [ "$all_checks" = 0 ] && [[ "${killers[0]}" == timeout:* ]]; then
        outcome=timeout by=${killers[0]}
      else
        outcome=killed by=$(IFS=,; echo "${killers[*]}")
      fi
    fi
    cp "$ROOT/src/raw/lua/$file" "$TREE/src/raw/lua/$file"
    current_file=""
  fi
  took=$((SECONDS - began))
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$sig" "$file" "$line" "$op" \
    "$original" "$mutated" "$outcome" "$by" "$took" >>"$results"
  printf '[%d/%d] #%s %s:%s %s: %s%s (%ss)\n' "$n" "$total" "$id" "$file" "$line" "$op" \
    "$outcome" "${by:+ by $by}" "$took"
done < <(tr '\t' '\037' <"$OUT/selected.tsv")

summary "$results"
