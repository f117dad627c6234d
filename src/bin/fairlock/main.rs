//! `fairlock`: run a command under a fair (FIFO) distributed lock on Redis, inspect a lock, or
//! release one by force. See the README's "Command-line tool" section.
//!
//! Every way of ending prints at most one line on stderr and exits with a documented code
//! (`exit.rs`); panics are turned into one line and exit code 70.

mod deadlocks;
mod duration;
mod exit;
mod holder;
mod list;
mod run;
mod signals;
mod status;
mod target;
mod waiting;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use crossbeam_channel::Receiver;
use fairlock::{FairLock, LockClient};

use crate::target::Target;

use crate::exit::{say, Failure};
use crate::holder::Wait;
use crate::waiting::WaitOptions;

const DEFAULT_URL: &str = "redis://127.0.0.1:6379/";

/// `--lease`'s default: the library's, written as `--lease` takes it.
static DEFAULT_LEASE: LazyLock<String> = LazyLock::new(|| duration::text(fairlock::DEFAULT_LEASE));

const EXIT_CODES: &str = "\
Exit codes:
  0-255  run: the command's exit code (128+N when signal N ended it)
  3      deadlocks: a deadlock was found (0: none)
  64     bad arguments, lock name, Redis URL or lease, or --permits other than the stored
  65     a key of the lock holds another program's data
  69     Redis unreachable, not Redis, or older than 6.2
  70     unexpected error
  77     Redis refused the credentials, or the user's ACL lacks a permission
  78     the server may evict keys (see --danger-accept-eviction)
  75     lock busy (--no-wait) or --wait ran out (see --busy-exit-code)
  79     the lock was lost while the command ran (or while held)
  126    the command could not be executed; 127: it was not found
  128+N  interrupted by signal N while waiting for the lock";

const RUN_ENV: &str = "\
The command gets FAIRLOCK_NAME, FAIRLOCK_TOKEN (the fencing token) and FAIRLOCK_OWNER in its
environment. SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to fairlock are passed on
to it; the lock is released once it has exited.";

/// A fair (FIFO), reentrant distributed lock on Redis, from the shell.
#[derive(Parser, Debug)]
#[command(name = "fairlock", version, propagate_version = true, after_help = EXIT_CODES)]
struct Cli {
    /// Redis server URL (rediss:// for TLS), redis+sentinel://[user:password@]host:port[,host:port...]/<master name>
    /// for the master of a Sentinel group (list every sentinel: the master that more than half
    /// of them name is used), or redis+cluster://[user:password@]host:port[,...]/ for a Redis
    /// Cluster; rediss+sentinel:// and rediss+cluster:// over TLS [default: $FAIRLOCK_REDIS_URL,
    /// then redis://127.0.0.1:6379/]
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "FAIRLOCK_REDIS_URL",
        hide_env = true
    )]
    redis: Option<String>,

    #[command(flatten)]
    access: AccessArgs,

    #[command(subcommand)]
    command: Cmd,
}

/// How to reach and log in to the server, besides the URL (every command).
#[derive(Args, Debug)]
struct AccessArgs {
    /// For a rediss:// URL: trust the certificate authorities in this PEM file instead of the
    /// system's [env: FAIRLOCK_TLS_CA]
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "FAIRLOCK_TLS_CA",
        hide_env = true
    )]
    tls_ca: Option<PathBuf>,
    /// For mutual TLS: the client certificate (PEM), with --tls-key [env: FAIRLOCK_TLS_CERT]
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "FAIRLOCK_TLS_CERT",
        hide_env = true,
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,
    /// For mutual TLS: the client certificate's private key (PEM) [env: FAIRLOCK_TLS_KEY]
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "FAIRLOCK_TLS_KEY",
        hide_env = true,
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
    /// Accept a server certificate that does not name the host connected to (still signed by a
    /// trusted CA): for servers reached by IP whose certificates name a host
    #[arg(long, global = true)]
    danger_accept_invalid_hostnames: bool,
    /// Read the password (or token) from this file for every new connection, so one that is
    /// rotated while fairlock runs is picked up; overrides the URL's [env: FAIRLOCK_PASSWORD_FILE]
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "FAIRLOCK_PASSWORD_FILE",
        hide_env = true
    )]
    password_file: Option<PathBuf>,
    /// Use a server whose maxmemory-policy may evict keys (refused otherwise): only if its
    /// memory never fills, as an evicted lock key can give a lock two holders
    #[arg(
        long,
        global = true,
        env = "FAIRLOCK_DANGER_ACCEPT_EVICTION",
        hide_env = true
    )]
    danger_accept_eviction: bool,
}

/// The server to connect to: its URL and how to reach it.
struct Server {
    url: String,
    access: AccessArgs,
}

impl Server {
    /// A client builder for the server with `lease`.
    fn builder(&self, lease: Duration) -> fairlock::LockClientBuilder {
        let a = &self.access;
        let mut b = LockClient::builder(&self.url)
            .lease(lease)
            .danger_accept_eviction(a.danger_accept_eviction)
            .danger_accept_invalid_hostnames(a.danger_accept_invalid_hostnames);
        if let Some(ca) = &a.tls_ca {
            b = b.tls_ca_file(ca);
        }
        if let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) {
            b = b.tls_client_cert_files(cert, key);
        }
        if let Some(file) = &a.password_file {
            // the user stays the URL's
            let user = user_of(&self.url);
            let file = file.clone();
            b = b.credentials_provider(move || {
                let password = std::fs::read_to_string(&file).map_err(|e| {
                    format!("cannot read the password file {}: {e}", file.display())
                })?;
                Ok(fairlock::Credentials::new(
                    user.as_deref(),
                    password.trim_end_matches(['\r', '\n']),
                ))
            });
        }
        b
    }
}

/// The user name a URL gives (`scheme://user:password@...`), if any, percent-decoded as the
/// redis crate decodes it when the password is in the URL (`ops%40team` is `ops@team`).
fn user_of(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    let user = userinfo.split(':').next()?;
    (!user.is_empty()).then(|| {
        percent_encoding::percent_decode_str(user)
            .decode_utf8_lossy()
            .into_owned()
    })
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Take the lock (waiting in FIFO order), run CMD while holding it, release when it exits.
    /// Exits with CMD's exit code.
    #[command(after_help = RUN_ENV)]
    Run(RunArgs),
    /// Show the holder, its lease and fencing token, and the waiters in queue order (with
    /// --semaphore: a semaphore's holders and waiters).
    Status(StatusArgs),
    /// List every lock that is held or waited for (with --all idle ones too), sorted by name;
    /// stale-looking holds are marked with `!`.
    List(ListArgs),
    /// Find deadlocks: cycles of holders each waiting for a lock the next one holds (locks,
    /// semaphores and read/write locks), each confirmed by a second reading; exits with 3 when
    /// one is found, 0 when none. Changes nothing.
    Deadlocks(DeadlocksArgs),
    /// Release the lock whoever holds it (with --force; with --hold: one holder of a
    /// semaphore); the next waiter gets it.
    Release(ReleaseArgs),
    /// Take the lock and hold it until interrupted (Ctrl-C, SIGTERM): for maintenance windows.
    Hold(HoldArgs),
}

/// How to take the lock (shared by `run` and `hold`).
#[derive(Args, Debug)]
struct AcquireArgs {
    /// Wait at most this long for the lock (e.g. 500ms, 30s, 5m) [default: as long as it takes]
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Do not wait: give up at once if the lock is held or anyone is queued for it
    #[arg(long)]
    no_wait: bool,
    /// Lease of the hold, renewed every third of it while fairlock runs (100ms to 7 days)
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, default_value = DEFAULT_LEASE.as_str())]
    lease: Duration,
    /// Exit code when the lock is busy or the wait ran out (0 makes "someone else runs it" a success)
    #[arg(long, value_name = "N", default_value_t = exit::TEMPFAIL)]
    busy_exit_code: u8,
    /// Say nothing when the lock is busy or the wait ran out
    #[arg(short, long)]
    quiet: bool,
    /// Use the semaphore NAME of N permits instead of the lock NAME: at most N holders at once
    /// across every fairlock that names it (like `consul lock -n N`); each takes one permit
    /// (see --take). Every user of the name must give the same N
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=fairlock::MAX_CAPACITY))]
    permits: Option<u64>,
    /// With --permits: how many of the N permits this holder takes (default 1)
    #[arg(long, value_name = "K", requires = "permits", value_parser = clap::value_parser!(u64).range(1..))]
    take: Option<u64>,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Lock name (with --permits: the semaphore's)
    name: String,
    #[command(flatten)]
    acquire: AcquireArgs,
    /// After the lock is lost and CMD got SIGTERM, wait this long before SIGKILL
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, default_value = "10s")]
    kill_grace: Duration,
    /// The command and its arguments (put `--` before it)
    #[arg(value_name = "CMD", required = true, trailing_var_arg = true)]
    command: Vec<OsString>,
}

#[derive(Args, Debug)]
struct StatusArgs {
    /// Lock name (with --semaphore: the semaphore's)
    name: String,
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
    /// Show the semaphore NAME (every holder with its permits, the waiters with the permits
    /// each wants) instead of the lock NAME
    #[arg(long)]
    semaphore: bool,
}

#[derive(Args, Debug)]
struct ListArgs {
    /// Print a JSON array (one `status --json` object per lock, with "stale") instead of a table
    #[arg(long)]
    json: bool,
    /// Also list idle locks: free, nobody waiting, but with keys left (the last fencing token
    /// is kept for days)
    #[arg(long)]
    all: bool,
    /// With --json: print the semaphores' objects (as `status --semaphore --json`) instead of
    /// the locks' (the text table shows both)
    #[arg(long)]
    semaphores: bool,
}

#[derive(Args, Debug)]
struct DeadlocksArgs {
    /// Print a JSON array (one object per cycle, its members in cycle order) instead of text
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ReleaseArgs {
    /// Lock name (with --hold: the semaphore's)
    name: String,
    /// Required: the lock is taken from whoever holds it, which may still be working
    #[arg(long)]
    force: bool,
    /// Release one holder of the semaphore NAME: its hold id, as `status --semaphore` shows it
    #[arg(long, value_name = "HOLD_ID")]
    hold: Option<String>,
}

#[derive(Args, Debug)]
struct HoldArgs {
    /// Lock name
    name: String,
    #[command(flatten)]
    acquire: AcquireArgs,
}

fn main() {
    std::panic::set_hook(Box::new(|info| {
        say(&format!("internal error ({info}); please report it"));
        std::process::exit(exit::SOFTWARE.into());
    }));
    let code = match Cli::try_parse() {
        Ok(cli) => match execute(cli) {
            Ok(code) => code,
            Err(f) => {
                if !f.message.is_empty() {
                    say(&f.message);
                }
                f.code
            }
        },
        Err(e) => usage_error(e),
    };
    std::process::exit(code.into());
}

/// Help and version go to stdout with code 0; any other parse error becomes one line, code 64.
fn usage_error(e: clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            0
        }
        // the first with no arguments at all, the second when $FAIRLOCK_REDIS_URL counts as one
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            say("missing command: use run, status, list, deadlocks, release or hold; see fairlock --help");
            exit::USAGE
        }
        _ => {
            say(&format!("{}; see fairlock --help", describe(&e)));
            exit::USAGE
        }
    }
}

/// A parse error as one line, from its kind and context (clap's own rendering spans several
/// lines, with tips and a usage block).
fn describe(e: &clap::Error) -> String {
    use clap::error::{ContextKind as Ck, ContextValue, ErrorKind};
    let ctx = |kind| e.get(kind).map(ToString::to_string).unwrap_or_default();
    let (arg, value) = (ctx(Ck::InvalidArg), ctx(Ck::InvalidValue));
    let mut line = match e.kind() {
        ErrorKind::InvalidSubcommand => {
            format!("unrecognized subcommand '{}'", ctx(Ck::InvalidSubcommand))
        }
        ErrorKind::UnknownArgument => format!("unexpected argument '{arg}' found"),
        ErrorKind::MissingRequiredArgument => {
            format!("the following required arguments were not provided: {arg}")
        }
        ErrorKind::ArgumentConflict if ctx(Ck::PriorArg) == arg => {
            format!("the argument '{arg}' cannot be used multiple times")
        }
        ErrorKind::ArgumentConflict => {
            format!(
                "the argument '{arg}' cannot be used with '{}'",
                ctx(Ck::PriorArg)
            )
        }
        ErrorKind::InvalidValue if value.is_empty() => {
            format!("a value is required for '{arg}' but none was supplied")
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            format!("invalid value '{value}' for '{arg}'")
        }
        kind => kind.to_string(),
    };
    // the value parser's own message (a bad duration, a number out of range)
    if let Some(source) = std::error::Error::source(e) {
        line = format!("{line}: {source}");
    }
    for (kind, what) in [
        (Ck::SuggestedSubcommand, "subcommand"),
        (Ck::SuggestedArg, "argument"),
        (Ck::SuggestedValue, "value"),
    ] {
        if let Some(suggested) = e.get(kind) {
            line = format!("{line}; tip: a similar {what} exists: '{suggested}'");
        }
    }
    if let Some(ContextValue::StyledStrs(tips)) = e.get(Ck::Suggested) {
        for tip in tips {
            line = format!("{line}; tip: {tip}");
        }
    }
    line
}

fn execute(cli: Cli) -> Result<u8, Failure> {
    let server = Server {
        url: cli.redis.unwrap_or_else(|| DEFAULT_URL.to_string()),
        access: cli.access,
    };
    match cli.command {
        Cmd::Run(args) => {
            let opts = wait_options(&args.acquire);
            // the client lives (and its watchdog and janitor with it) until the command is done
            let (_client, lock, signals) = connect_to_hold(&server, &args.name, &args.acquire)?;
            run::run(&lock, &signals, &opts, args.kill_grace, &args.command)
        }
        Cmd::Hold(args) => {
            let opts = wait_options(&args.acquire);
            let (_client, lock, signals) = connect_to_hold(&server, &args.name, &args.acquire)?;
            run::hold(&lock, &signals, &opts)
        }
        Cmd::Status(args) => {
            fairlock::validate_name(&args.name)?;
            if args.semaphore {
                let client = build_client(&server, fairlock::DEFAULT_LEASE)?;
                // status reads whatever capacity is stored; the handle's is not used
                let sem = client.semaphore(&args.name, 1)?;
                return status::semaphore_status(&sem, args.json);
            }
            let (client, lock) = connect(&server, &args.name, fairlock::DEFAULT_LEASE)?;
            status::status(&lock, args.json, client.config().danger_accept_eviction)
        }
        Cmd::List(args) => {
            let client = build_client(&server, fairlock::DEFAULT_LEASE)?;
            list::list(
                &client,
                args.json,
                args.all,
                args.semaphores,
                client.config().danger_accept_eviction,
            )
        }
        Cmd::Deadlocks(args) => {
            let client = build_client(&server, fairlock::DEFAULT_LEASE)?;
            deadlocks::deadlocks(&client, args.json)
        }
        Cmd::Release(args) => {
            if !args.force {
                return Err(Failure::usage(
                    "release takes the lock from whoever holds it, which may still be working: add --force to do it",
                ));
            }
            fairlock::validate_name(&args.name)?;
            if let Some(hold) = &args.hold {
                let client = build_client(&server, fairlock::DEFAULT_LEASE)?;
                let sem = client.semaphore(&args.name, 1)?;
                return status::release_permits(&sem, hold);
            }
            let (_client, lock) = connect(&server, &args.name, fairlock::DEFAULT_LEASE)?;
            status::release(&lock)
        }
    }
}

fn wait_options(a: &AcquireArgs) -> WaitOptions {
    let wait = match (a.no_wait, a.wait) {
        (true, _) => Wait::No,
        (false, Some(d)) => Wait::For(d),
        (false, None) => Wait::Forever,
    };
    WaitOptions {
        wait,
        busy_exit_code: a.busy_exit_code,
        quiet: a.quiet,
    }
}

/// For `run` and `hold`: check the name and lease, catch signals, connect. Arguments are checked
/// before the server is contacted, so a typo is a usage error (64) even when Redis is down.
fn connect_to_hold(
    server: &Server,
    name: &str,
    acquire: &AcquireArgs,
) -> Result<(LockClient, Target, Receiver<signals::Received>), Failure> {
    let lease = acquire.lease;
    fairlock::validate_name(name)?;
    if let (Some(take), Some(permits)) = (acquire.take, acquire.permits) {
        if take > permits {
            return Err(Failure::usage(format!(
                "--take {take} is more than --permits {permits}: such a request could never be served"
            )));
        }
    }
    if !(fairlock::MIN_LEASE..=fairlock::MAX_LEASE).contains(&lease) {
        return Err(Failure::usage(format!(
            "invalid --lease {}: it must be between {} and {}",
            duration::human(lease),
            humantime::format_duration(fairlock::MIN_LEASE),
            humantime::format_duration(fairlock::MAX_LEASE),
        )));
    }
    let signals = signals::install().map_err(|e| {
        Failure::new(
            exit::SOFTWARE,
            format!("cannot install signal handlers: {e}"),
        )
    })?;
    let client = build_client(server, lease)?;
    let target = match acquire.permits {
        Some(capacity) => Target::Permits {
            sem: client.semaphore(name, capacity)?,
            permits: acquire.take.unwrap_or(1),
        },
        None => Target::Lock(client.fair_lock(name)?),
    };
    Ok((client, target, signals))
}

/// Connect to Redis (the name has been checked).
fn connect(
    server: &Server,
    name: &str,
    lease: Duration,
) -> Result<(LockClient, FairLock), Failure> {
    let client = build_client(server, lease)?;
    let lock = client.fair_lock(name)?;
    Ok((client, lock))
}

/// Connect to Redis; an unreachable server is named by its URL (without the password). A
/// server check the client could not make (the user is refused `INFO` and `CONFIG GET`) is
/// said on stderr: the tool goes on, as the library does, but not silently.
fn build_client(server: &Server, lease: Duration) -> Result<LockClient, Failure> {
    let client = server.builder(lease).build().map_err(|e| {
        let mut f = Failure::from(e);
        if f.code == exit::UNAVAILABLE {
            f.message = format!(
                "{} (Redis URL {})",
                f.message,
                fairlock::redact_url(&server.url)
            );
        }
        f
    })?;
    if let Some(why) = client.skipped_checks() {
        say(&format!("warning: {why}"));
    }
    Ok(client)
}
