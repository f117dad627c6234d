//! The command connections of a client: an r2d2 pool of the manager's connections, and
//! [`with_pooled`], which runs a call on one, riding out stale connections and failovers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{Conn, Manager};
use crate::error::{is_tls_failure, permission_error, Error, Result};

/// Run `f` on a connection from `pool`. A pooled connection can be stale (Redis restarted since
/// it was last used); when one turns out dropped by the server, `f` runs again on another, up to
/// `pool size + 1` times, without that counting as a failure. Through a Sentinel group, a call
/// that fails for want of a master (a failover under way) is also repeated, with pauses, for up
/// to the manager's `patience`. Only for calls that are safe to repeat, which all of fairlock's
/// are (see the scripts' headers).
pub(crate) fn with_pooled<T>(
    pool: &Pool,
    during: &'static str,
    mut f: impl FnMut(&mut Conn) -> Result<T>,
) -> Result<T> {
    let give_up = Instant::now() + pool.patience;
    let mut pause = FAILOVER_PAUSE.0;
    loop {
        match once_pooled(pool, during, &mut f) {
            Err(e) if e.is_connection() && Instant::now() + pause < give_up => {
                log::debug!("fairlock: {e}; trying again in {pause:?} (failover)");
                std::thread::sleep(pause);
                pause = (pause * 2).min(FAILOVER_PAUSE.1);
            }
            other => return other,
        }
    }
}

/// The command connections of a client: an r2d2 pool of [`Manager`]'s connections, and how long
/// a call through it rides out a failover.
#[derive(Clone)]
pub(crate) struct Pool {
    pool: r2d2::Pool<Pooled>,
    manager: Arc<Manager>,
    patience: Duration,
    refusal: Arc<Mutex<Option<Refusal>>>,
}

/// The manager as r2d2 holds it: shared with the waker and the master watch (a Sentinel
/// group's master generation is one for all of a client's connections). Remembers why the last
/// connection could not be made when the server refused the credentials or the TLS handshake
/// failed, which r2d2 reports only as text: a checkout that fails after it is then that error,
/// not an unavailable server.
pub(crate) struct Pooled(Arc<Manager>, Arc<Mutex<Option<Refusal>>>);

/// Why the server refused the last new connection of a pool.
#[derive(Clone)]
pub(crate) struct Refusal {
    credentials: bool,
    tls: bool,
    detail: String,
}

impl Pool {
    /// A pool of at most `size` connections; waits at most `checkout_timeout` for one.
    pub fn new(manager: Arc<Manager>, size: u32, checkout_timeout: Duration) -> Pool {
        let patience = manager.patience;
        let refusal = Arc::new(Mutex::new(None));
        let pooled = Pooled(Arc::clone(&manager), Arc::clone(&refusal));
        let pool = r2d2::Pool::builder()
            .max_size(size)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(checkout_timeout)
            .error_handler(Box::new(r2d2::NopErrorHandler))
            .build_unchecked(pooled);
        Pool {
            pool,
            manager,
            patience,
            refusal,
        }
    }

    /// How long a call waits for its reply, as configured (`Config::read_timeout`); a caller
    /// that asks for less on a connection (`Conn::set_read_timeout`) sets it back.
    pub fn read_timeout(&self) -> Duration {
        self.manager.read_timeout
    }
}

/// Pauses between calls repeated during a failover: the first, and the longest.
const FAILOVER_PAUSE: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

fn once_pooled<T>(
    pool: &Pool,
    during: &'static str,
    f: &mut impl FnMut(&mut Conn) -> Result<T>,
) -> Result<T> {
    let mut attempts = pool.pool.max_size() + 1;
    let mut retired = 0;
    loop {
        let mut conn = pool
            .pool
            .get()
            .map_err(|e| match pool.refusal.lock().clone() {
                Some(Refusal {
                    credentials,
                    tls: false,
                    detail,
                }) => Error::PermissionDenied {
                    during,
                    detail,
                    credentials,
                },
                Some(Refusal { detail, .. }) => Error::Tls { during, detail },
                None => Error::Connection {
                    during,
                    detail: format!("no connection available: {e}"),
                    source: Some(Box::new(e)),
                },
            })?;
        if pool.manager.is_retired(&conn) {
            // idle since before the Sentinel group named another master: r2d2 drops it
            conn.broken = true;
            if retired < pool.pool.max_size() {
                retired += 1;
                continue;
            }
        }
        match f(&mut conn) {
            Err(e) if attempts > 1 && conn.was_dropped() => {
                log::debug!("fairlock: stale connection while {during} ({e}); retrying");
                attempts -= 1;
            }
            other => return other,
        }
    }
}

impl r2d2::ManageConnection for Pooled {
    type Connection = Conn;
    type Error = redis::RedisError;

    fn connect(&self) -> redis::RedisResult<Conn> {
        let result = self.0.open();
        *self.1.lock() = match &result {
            Ok(_) => None,
            Err(e) => {
                let tls = is_tls_failure(e);
                permission_error(e)
                    .map(|credentials| (credentials, false))
                    .or(tls.then_some((false, true)))
                    .map(|(credentials, tls)| Refusal {
                        credentials,
                        tls,
                        detail: e.to_string(),
                    })
            }
        };
        result
    }

    fn is_valid(&self, conn: &mut Conn) -> redis::RedisResult<()> {
        conn.query::<()>(&redis::cmd("PING"))
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.broken || !conn.inner.as_ref_like().is_open() || self.0.is_retired(conn)
    }
}
