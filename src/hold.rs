//! The per-thread record of which locks a thread holds (which makes re-entry one round trip), and
//! the state the watchdog and a hold's guards share.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::boot_clock::BootInstant;
use crate::kind::HoldKind;
use crate::loss::LossSignal;

/// What the watchdog and the guards of one hold share.
pub(crate) struct HoldState {
    pub lost: AtomicBool,
    /// Local estimate of when the lease runs out (never later than the server's). On a clock
    /// that counts system suspend, so the estimate stays early across one.
    pub expires: Mutex<BootInstant>,
    /// Told once when the watchdog finds the hold lost (see `loss.rs`).
    pub loss: LossSignal,
}

impl HoldState {
    /// The state of the hold of the `kind` named `name` with `token`, its lease ending at
    /// `expires`; `labelled`: its metrics carry the name.
    pub fn new(
        name: &str,
        kind: HoldKind,
        token: u64,
        expires: BootInstant,
        labelled: bool,
    ) -> HoldState {
        HoldState {
            lost: AtomicBool::new(false),
            expires: Mutex::new(expires),
            loss: LossSignal::new(name, kind, token, labelled),
        }
    }
}

/// One thread's hold of one lock: all of its nested guards share it.
pub(crate) struct Hold {
    pub token: u64,
    pub depth: Cell<u32>,
    pub state: Arc<HoldState>,
    /// Watchdog registration, when the lease is renewed.
    pub renewal: Option<u64>,
    /// The attempt that got this hold, when one of its acquire requests may still arrive (it
    /// went unanswered, or was sent twice): the outermost release leaves a left mark for it.
    pub late_acquire: Option<u64>,
    /// A guard of it was leaked: the hold is given up as a whole (it runs out by its lease, not
    /// renewed) and its other guards release nothing.
    pub leaked: Cell<bool>,
    /// The hold in the metrics, until its last guard is released or leaked, or it is found
    /// lost.
    pub metric: Counted,
}

/// A hold of any kind (a lock's, or permits) counted in the metrics while it lasts: in
/// `fairlock_held_locks` from now, and in `fairlock_hold_seconds` once dropped.
pub(crate) struct Counted {
    started: std::time::Instant,
    label: Option<String>,
}

impl Counted {
    /// A hold that starts now; `label`: the name its metrics carry, if they carry one.
    pub fn start(label: Option<String>) -> Counted {
        crate::telemetry::holding(1.0);
        Counted {
            started: std::time::Instant::now(),
            label,
        }
    }

    /// The name the hold's metrics carry.
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        crate::telemetry::held(self.started.elapsed(), self.label.as_deref());
        crate::telemetry::holding(-1.0);
    }
}

impl Hold {
    /// Lost for sure: the watchdog said so, or the lease ran out by the local estimate (which
    /// is never later than the server's).
    pub fn is_lost(&self) -> bool {
        self.state.lost.load(Ordering::SeqCst) || *self.state.expires.lock() <= BootInstant::now()
    }
}

/// Which hold: (client id, lock key).
pub(crate) type HoldKey = (String, String);

thread_local! {
    static HOLDS: RefCell<HashMap<HoldKey, Rc<Hold>>> = RefCell::new(HashMap::new());
    /// Holds the thread leaked on purpose, with the (early) end of their lease: until then its
    /// next acquisition of that lock queues behind the leaked hold instead of passing it on.
    static LEAKED: RefCell<HashMap<HoldKey, BootInstant>> = RefCell::new(HashMap::new());
}

/// The thread leaked its hold of `key`, whose lease ends at `expires` by the local estimate.
pub(crate) fn remember_leaked(key: HoldKey, expires: BootInstant) {
    let _ = LEAKED.try_with(|l| l.borrow_mut().insert(key, expires));
}

/// Whether the thread leaked a hold of `key` whose lease has not run out by the estimate.
pub(crate) fn leaked_and_running(key: &HoldKey) -> bool {
    LEAKED
        .try_with(|l| {
            let mut l = l.borrow_mut();
            let running = l.get(key).is_some_and(|&end| end > BootInstant::now());
            if !running {
                l.remove(key);
            }
            running
        })
        .unwrap_or(false)
}

/// The calling thread's hold of `key`, if any.
pub(crate) fn current(key: &HoldKey) -> Option<Rc<Hold>> {
    HOLDS
        .try_with(|h| h.borrow().get(key).cloned())
        .ok()
        .flatten()
}

/// Record `hold` as the calling thread's hold of `key`.
pub(crate) fn remember(key: HoldKey, hold: Rc<Hold>) {
    let _ = HOLDS.try_with(|h| h.borrow_mut().insert(key, hold));
}

/// Forget `hold` as the calling thread's hold of `key`. Only removes the entry if it is this
/// very hold: an old guard must not evict a newer hold of the same lock.
pub(crate) fn forget(key: &HoldKey, hold: &Rc<Hold>) {
    let _ = HOLDS.try_with(|h| {
        let mut map = h.borrow_mut();
        if map.get(key).is_some_and(|cur| Rc::ptr_eq(cur, hold)) {
            map.remove(key);
        }
    });
}
