//! The compiled-in scripts (`lua/`): each transition's code as `EVALSHA` sends it, and the
//! function library Redis 7 loads once.

use std::fmt;
use std::sync::LazyLock;

use redis::{ConnectionLike, Value};

use super::Runner;
use crate::error::{Error, Result};

const COMMON: &str = include_str!("lua/common.lua");
/// Helpers of the scripts that take the lock or change the queue (after `COMMON`).
const STATE: &str = include_str!("lua/state.lua");
/// Helpers of the semaphore's scripts (after `STATE`; see docs/semaphores.md).
const SEM: &str = include_str!("lua/sem.lua");

/// A script file's text: the compiled-in one. Built with `--cfg fairlock_mutants` (only
/// scripts/mutants.sh does, in its own target directory), the file of that name in
/// `$FAIRLOCK_LUA_DIR` when the variable is set: the mutation score then runs each mutant's
/// checks without rebuilding the crate and its test binaries.
#[cfg(not(fairlock_mutants))]
fn text(_file: &str, compiled: &'static str) -> &'static str {
    compiled
}

#[cfg(fairlock_mutants)]
fn text(file: &str, compiled: &'static str) -> &'static str {
    match std::env::var_os("FAIRLOCK_LUA_DIR") {
        None => compiled,
        Some(dir) => {
            let path = std::path::Path::new(&dir).join(file);
            // Never in a library build: this function exists only under `--cfg
            // fairlock_mutants`, which only scripts/mutants.sh sets for its test binaries.
            // There a missing script must stop the check loudly: falling back to the
            // compiled-in text would let every mutant of that file "survive".
            let code = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!("FAIRLOCK_LUA_DIR: cannot read {}: {e}", path.display())
            });
            // read once per script (the callers keep it in a LazyLock): a bounded leak
            Box::leak(code.into_boxed_str())
        }
    }
}

fn common() -> &'static str {
    text("common.lua", COMMON)
}

fn state() -> &'static str {
    text("state.lua", STATE)
}

fn sem() -> &'static str {
    text("sem.lua", SEM)
}

/// A transition's source: its file in `lua/`, and whether it uses `state.lua`'s helpers.
struct Source {
    name: &'static str,
    state: bool,
    /// uses sem.lua's helpers too (a semaphore's script)
    sem: bool,
    /// only reads: registered with the `no-writes` flag, so that Redis runs it when it refuses
    /// writes (`maxmemory` reached under `noeviction`), when an operator needs it most
    reads_only: bool,
    body: &'static str,
}

macro_rules! source {
    ($name:literal, $state:expr) => {
        source!($name, $state, false)
    };
    ($name:literal, $state:expr, $sem:expr) => {
        source!($name, $state, $sem, false)
    };
    ($name:literal, $state:expr, $sem:expr, $reads_only:expr) => {
        Source {
            name: $name,
            state: $state,
            sem: $sem,
            reads_only: $reads_only,
            body: include_str!(concat!("lua/", $name, ".lua")),
        }
    };
}

const ACQUIRE_SOURCE: Source = source!("acquire", true);
const REENTER_SOURCE: Source = source!("reenter", false);
const RELEASE_SOURCE: Source = source!("release", true);
const RENEW_SOURCE: Source = source!("renew", false);
const LEAVE_SOURCE: Source = source!("leave", true);
const FORCE_UNLOCK_SOURCE: Source = source!("force_unlock", true);
const HEARTBEAT_SOURCE: Source = source!("heartbeat", true);
const STATUS_SOURCE: Source = source!("status", true, false, true);
const SEM_ACQUIRE_SOURCE: Source = source!("sem_acquire", true, true);
const SEM_RELEASE_SOURCE: Source = source!("sem_release", true, true);
const SEM_RENEW_SOURCE: Source = source!("sem_renew", true, true);
const SEM_LEAVE_SOURCE: Source = source!("sem_leave", true, true);
const SEM_HEARTBEAT_SOURCE: Source = source!("sem_heartbeat", true, true);
const SEM_STATUS_SOURCE: Source = source!("sem_status", true, true, true);
const SEM_CAPACITY_SOURCE: Source = source!("sem_capacity", true, true);

const SOURCES: [&Source; 15] = [
    &ACQUIRE_SOURCE,
    &REENTER_SOURCE,
    &RELEASE_SOURCE,
    &RENEW_SOURCE,
    &LEAVE_SOURCE,
    &FORCE_UNLOCK_SOURCE,
    &HEARTBEAT_SOURCE,
    &STATUS_SOURCE,
    &SEM_ACQUIRE_SOURCE,
    &SEM_RELEASE_SOURCE,
    &SEM_RENEW_SOURCE,
    &SEM_LEAVE_SOURCE,
    &SEM_HEARTBEAT_SOURCE,
    &SEM_STATUS_SOURCE,
    &SEM_CAPACITY_SOURCE,
];

impl Source {
    /// The transition's own file.
    fn body(&self) -> &'static str {
        text(&format!("{}.lua", self.name), self.body)
    }

    /// What a run does first: set the run's keys and settings (and state.lua's per-run state).
    fn reset(&self) -> &'static str {
        if self.state {
            "reset(KEYS, ARGV)\nreset_state()\n"
        } else {
            "reset(KEYS, ARGV)\n"
        }
    }
}

/// The function library of every script (Redis 7+): its name carries a hash of its code, so
/// clients of different fairlock versions can share a server, each calling its own functions.
struct Library {
    name: String,
    code: String,
}

static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let helpers = format!("{}\n{}\n{}\n", common(), state(), sem());
    let mut hashed = helpers.clone();
    for s in SOURCES {
        hashed.push_str(s.reset());
        hashed.push_str(s.body());
        // (the flags are part of the code: a change of them is another library)
        hashed.push_str(if s.reads_only { "no-writes" } else { "" });
    }
    let name = format!("fairlock_{}", &redis::Script::new(&hashed).get_hash()[..12]);
    let mut code = format!("#!lua name={name}\n{helpers}");
    for s in SOURCES {
        let (name_and_flags, close) = if s.reads_only {
            (
                format!(
                    "{{function_name = '{name}_{}', flags = {{ 'no-writes' }}, callback = ",
                    s.name
                ),
                "}",
            )
        } else {
            (format!("('{name}_{}', ", s.name), ")")
        };
        code.push_str(&format!(
            "\nredis.register_function{name_and_flags}function(KEYS, ARGV)\n{}{}\nend{close}\n",
            s.reset(),
            s.body(),
        ));
    }
    Library { name, code }
});

/// The function library's name (`fairlock_<hash of its code>`).
pub fn library_name() -> &'static str {
    &LIBRARY.name
}

/// The function library's code (`#!lua name=fairlock_<hash>` ...), as `FUNCTION LOAD` takes it.
pub fn library_code() -> &'static str {
    &LIBRARY.code
}

/// Load the function library into the server (every master of a Cluster); `FCALL` fails with
/// "Function not found" until then. Loading it again is harmless: the same name is the same code.
///
/// # Errors
/// [`Error::Connection`] when Redis cannot be reached; the server's own error when it refuses
/// (a Redis older than 7, or an ACL user without the `FUNCTION` command).
pub fn load_library(conn: &mut dyn ConnectionLike) -> Result<()> {
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&LIBRARY.code)
        .query::<Value>(conn)
        .map(|_| ())
        .map_err(|e| Error::from_redis("loading the function library", e))
}

/// One compiled-in script: the `EVALSHA` form (`common.lua`, `state.lua` where it needs it, then
/// the transition's own file) with its SHA1, and the name of its function in the library.
pub struct Script {
    name: &'static str,
    code: String,
    sha: String,
    function: String,
}

/// The script's name, SHA1 and function name (not its code).
impl fmt::Debug for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Script")
            .field("name", &self.name)
            .field("sha", &self.sha)
            .field("function", &self.function)
            .finish_non_exhaustive()
    }
}

impl Script {
    fn new(source: &Source) -> Script {
        let state = if source.state { state() } else { "" };
        let sem = if source.sem { sem() } else { "" };
        let code = format!(
            "{common}\n{state}\n{sem}\n{reset}{body}",
            common = common(),
            reset = source.reset(),
            body = source.body()
        );
        let sha = redis::Script::new(&code).get_hash().to_string();
        let function = format!("{}_{}", LIBRARY.name, source.name);
        Script {
            name: source.name,
            code,
            sha,
            function,
        }
    }

    /// The transition's name, as its file in `lua/` is called ("acquire", "release", ...).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The SHA1 that `EVALSHA` names the script by.
    pub fn sha(&self) -> &str {
        &self.sha
    }

    /// The script as `EVALSHA` runs it (helpers, `reset`, then the transition's own file).
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The name that `FCALL` calls the script by (`fairlock_<library hash>_<name>`).
    pub fn function(&self) -> &str {
        &self.function
    }

    /// Load the script into the server's script cache (EVALSHA fails with NOSCRIPT until then).
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached.
    pub fn load(&self, conn: &mut dyn ConnectionLike) -> Result<()> {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&self.code)
            .query::<String>(conn)
            .map(|_| ())
            .map_err(|e| Error::from_redis("loading a script", e))
    }

    /// Load what `runner` calls this script through: the script, or the whole library.
    pub(super) fn load_for(&self, runner: Runner, conn: &mut dyn ConnectionLike) -> Result<()> {
        match runner {
            Runner::Eval => self.load(conn),
            Runner::Functions => load_library(conn),
        }
    }
}

macro_rules! script {
    ($source:expr) => {
        LazyLock::new(|| Script::new(&$source))
    };
}

pub(super) static ACQUIRE: LazyLock<Script> = script!(ACQUIRE_SOURCE);
pub(super) static REENTER: LazyLock<Script> = script!(REENTER_SOURCE);
pub(super) static RELEASE: LazyLock<Script> = script!(RELEASE_SOURCE);
pub(super) static RENEW: LazyLock<Script> = script!(RENEW_SOURCE);
pub(super) static LEAVE: LazyLock<Script> = script!(LEAVE_SOURCE);
pub(super) static FORCE_UNLOCK: LazyLock<Script> = script!(FORCE_UNLOCK_SOURCE);
pub(super) static HEARTBEAT: LazyLock<Script> = script!(HEARTBEAT_SOURCE);
pub(super) static STATUS: LazyLock<Script> = script!(STATUS_SOURCE);
pub(super) static SEM_ACQUIRE: LazyLock<Script> = script!(SEM_ACQUIRE_SOURCE);
pub(super) static SEM_RELEASE: LazyLock<Script> = script!(SEM_RELEASE_SOURCE);
pub(super) static SEM_RENEW: LazyLock<Script> = script!(SEM_RENEW_SOURCE);
pub(super) static SEM_LEAVE: LazyLock<Script> = script!(SEM_LEAVE_SOURCE);
pub(super) static SEM_HEARTBEAT: LazyLock<Script> = script!(SEM_HEARTBEAT_SOURCE);
pub(super) static SEM_STATUS: LazyLock<Script> = script!(SEM_STATUS_SOURCE);
pub(super) static SEM_CAPACITY: LazyLock<Script> = script!(SEM_CAPACITY_SOURCE);

/// Every script (the lock's, then the semaphore's), for loading them ahead of use.
pub fn scripts() -> [&'static Script; 15] {
    [
        &ACQUIRE,
        &REENTER,
        &RELEASE,
        &RENEW,
        &LEAVE,
        &FORCE_UNLOCK,
        &HEARTBEAT,
        &STATUS,
        &SEM_ACQUIRE,
        &SEM_RELEASE,
        &SEM_RENEW,
        &SEM_LEAVE,
        &SEM_HEARTBEAT,
        &SEM_STATUS,
        &SEM_CAPACITY,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_are_distinct_and_start_with_common() {
        for s in scripts() {
            assert!(s.code.starts_with(COMMON));
            assert_eq!(s.sha.len(), 40);
        }
        assert_ne!(ACQUIRE.sha, RELEASE.sha);
    }
}
