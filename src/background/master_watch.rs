//! The master watch: through a Sentinel group, one thread per client asks the sentinels every
//! [`MASTER_WATCH_INTERVAL`] which master they name, and moves the client's connections when it
//! changed (see [`Manager::follow_master`]).
//!
//! Without it a client would learn of a failover only when its connections fail. A master
//! that died does fail them; but after `SENTINEL FAILOVER` (or a partition that heals) the old
//! master stays up and writable until the sentinels make it a replica, seconds later, and
//! every grant it makes meanwhile is lost with its data. Asking bounds that window to the
//! interval plus the sentinels' own delay.

use std::sync::Arc;
use std::thread;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::connection::{Manager, MASTER_WATCH_INTERVAL};
use crate::error::{Error, Result};

/// The running watch; the thread ends when this is dropped (with its client).
pub(crate) struct MasterWatch {
    _stop: Sender<()>,
}

impl MasterWatch {
    /// Start the watch for a Sentinel group's `manager`; `None` for one node or a Cluster
    /// (a Cluster's connections follow its slot map by themselves).
    ///
    /// # Errors
    /// [`Error::Io`] when the thread cannot be started.
    pub fn start(manager: Arc<Manager>, client_id: &str) -> Result<Option<MasterWatch>> {
        if !manager.is_sentinel() {
            return Ok(None);
        }
        let (stop, stopped) = crossbeam_channel::bounded(0);
        thread::Builder::new()
            .name(format!("fairlock-sentinel-{}", &client_id[..8]))
            .spawn(move || run(&manager, &stopped))
            .map_err(|source| Error::Io {
                during: "starting the master watch thread",
                source,
            })?;
        Ok(Some(MasterWatch { _stop: stop }))
    }
}

fn run(manager: &Manager, stopped: &Receiver<()>) {
    // log a failure once until the sentinels answer again (they may be down for long)
    let mut failing = false;
    loop {
        match stopped.recv_timeout(MASTER_WATCH_INTERVAL) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        match manager.follow_master() {
            Ok(()) => failing = false,
            Err(e) if !failing => {
                failing = true;
                log::warn!("fairlock: {e}; the client stays with the master it knows and asks again every {MASTER_WATCH_INTERVAL:?}");
            }
            Err(e) => log::debug!("fairlock: {e}"),
        }
    }
}
