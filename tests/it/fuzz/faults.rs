//! The operator's force-unlock and the faults: stray duplicates and late deliveries, crashes,
//! pauses, time passing, evictions, data loss and server clock steps.

use std::collections::HashSet;
use std::time::Duration;

use crate::fuzz::faketime::server_time_us;
use crate::fuzz::model::Prim;
use crate::fuzz::model::{Client, State, Unsure};
use crate::fuzz::steps::{EvictKey, Fault, Who};
use crate::fuzz::world::{describe, World, MAX_BEHIND_MS};

impl World {
    /// The operator reads the holder and releases exactly that hold (owner and token).
    pub fn force_unlock(&mut self, lock: usize, fault: Fault) -> bool {
        if lock >= self.locks.len() {
            return false;
        }
        self.say(format!("operator force-unlock lock={lock}: status"));
        let call = self.locks[lock].status();
        let s = self.exec(
            Some(Who::Operator),
            "operator status".into(),
            call,
            Fault::None,
        );
        let Ok(st) = s.reply else {
            return true;
        };
        let (owner, token) = if !st.owner.is_empty() {
            // the named hold loses the mutual exclusion guarantee from here on, by design: its
            // holder may count on it until its next renewal. Only a holder that has it in hand
            // (or whose popped wake-up is on its way, or when the force may land later, after a
            // pop): a hand-off nobody popped goes with its wake-up, and a grant popped after the
            // force would be a second holder (`force_exemption`)
            self.checker.forced[lock].insert(st.token);
            if self.force_exemption(lock, None, st.token, fault) {
                self.checker.exempt(lock, st.token);
            }
            (st.owner.clone(), st.token)
        } else if !st.queue.is_empty() {
            (String::new(), 0)
        } else {
            self.say(" -> free, nothing to do");
            return true;
        };
        self.say(format!(" -> holder {owner:?} token={token}; force_unlock"));
        let label = format!("operator force_unlock {owner:?} token={token}");
        self.operator_force(label, fault, |w| w.locks[lock].force_unlock(&owner, token));
        true
    }

    /// The operator's forced release (a lock's or a semaphore's), under `fault`: a lost reply
    /// is retried by its connection layer, and a copy held up is sent again now while the
    /// first comes later.
    pub fn operator_force<T: std::fmt::Debug + 'static>(
        &mut self,
        label: String,
        fault: Fault,
        call: impl Fn(&World) -> fairlock::raw::Call<T>,
    ) {
        let fault = match fault {
            Fault::Lost | Fault::Retried => Fault::Retried,
            Fault::Late | Fault::SlowFirst => Fault::Late,
            Fault::None | Fault::Dropped => Fault::None,
        };
        let mut s = self.exec(Some(Who::Operator), label.clone(), call(self), fault);
        if fault == Fault::Late {
            s = self.exec(Some(Who::Operator), label, call(self), Fault::None);
        }
        self.say(format!(" -> {}", describe(&s.reply)));
    }

    /// A stray duplicate of the last command of a thread (or the operator); nobody reads it.
    pub fn resend(&mut self, who: Who) -> bool {
        let last = match who {
            Who::Thread(c, t) if c < self.clients.len() && t < self.clients[c].threads.len() => {
                self.clients[c].threads[t].last.clone()
            }
            Who::Thread(..) => None,
            Who::Operator => self.operator_last.clone(),
        };
        let Some(last) = last else {
            return false;
        };
        self.say(format!("stray duplicate of \"{}\"", last.label()));
        // a duplicate its client never learns of: nothing can mark its attempt (a late copy
        // of it that takes a free lock is the documented limit of unseen duplicates)
        let unsure = self.unsure();
        if let (Who::Thread(c, t), Some((lock, attempt))) = (who, acquire_of(last.label())) {
            self.clients[c].threads[t]
                .lock
                .unsure_end
                .insert((lock, attempt), unsure);
        }
        if let (Who::Thread(c, t), Some((sem, attempt))) =
            (who, crate::fuzz::sem::sem_acquire_of(last.label()))
        {
            self.clients[c].threads[t]
                .sem
                .unsure_end
                .insert((sem, attempt), unsure);
        }
        self.refresh_unsure(last.label(), last.owner());
        let sent = self.clock.fz();
        let reply = last.resend(&mut self.conns[Self::conn_of(Some(who))]);
        self.copy_arrived(&*last);
        self.note_sent(last.owner());
        self.after_call(None, sent);
        self.say(format!(" -> {reply}"));
        self.stats.add("fault: stray duplicate", 1);
        true
    }

    /// A copy of request `r` reached Redis with its reply unread: an acquire's place may date
    /// from it (FIFO by the replies).
    fn copy_arrived(&mut self, r: &dyn crate::fuzz::world::Resend) {
        let Some(owner) = r.owner() else {
            return;
        };
        if let Some((lock, attempt)) = acquire_of(r.label()) {
            self.fifo_copy_arrived(Prim::Lock, owner, lock, attempt);
        }
        if let Some((sem, attempt)) = crate::fuzz::sem::sem_acquire_of(r.label()) {
            self.fifo_copy_arrived(Prim::Sem, owner, sem, attempt);
        }
    }

    /// Now, for `Thread::unsure_end`.
    pub fn unsure(&self) -> Unsure {
        Unsure {
            since_real: self.clock.real(),
            back_steps_ms: self.back_steps_ms,
        }
    }

    /// A late or repeated copy of the request `label` (of `owner`) is about to reach Redis: an
    /// acquire may act for its attempt, a heartbeat refresh the places its client's attempts
    /// left behind (it names no attempt in its label: all of them), so their unsure ends are
    /// fresh again.
    fn refresh_unsure(&mut self, label: &str, owner: Option<&str>) {
        let unsure = self.unsure();
        // a crashed client's request: its places may be refreshed, or taken by this copy
        if let Some(crashed) = owner
            .and_then(|o| o.rsplit_once(':'))
            .and_then(|(id, _)| self.crashed.get_mut(id))
        {
            crashed.1 = unsure;
        }
        let thread = owner.and_then(|o| self.thread_of(o));
        if let (Some((c, t)), Some(key)) = (thread, acquire_of(label)) {
            if let Some(u) = self.clients[c].threads[t].lock.unsure_end.get_mut(&key) {
                *u = unsure;
            }
        }
        if let (Some((c, t)), Some(key)) = (thread, crate::fuzz::sem::sem_acquire_of(label)) {
            if let Some(u) = self.clients[c].threads[t].sem.unsure_end.get_mut(&key) {
                *u = unsure;
            }
        }
        let heartbeat = label
            .strip_prefix('c')
            .and_then(|rest| rest.split_once(' '))
            .filter(|(_, what)| *what == "heartbeat" || *what == "sem heartbeat");
        if let Some((c, what)) = heartbeat {
            let Ok(c) = c.parse::<usize>() else {
                return;
            };
            // (sent by this slot's client, or by one that crashed in it since)
            for (slot, u) in self.crashed.values_mut() {
                if *slot == c {
                    *u = unsure;
                }
            }
            let Some(cl) = self.clients.get_mut(c) else {
                return;
            };
            for th in &mut cl.threads {
                let ends = if what == "heartbeat" {
                    &mut th.lock.unsure_end
                } else {
                    &mut th.sem.unsure_end
                };
                ends.values_mut().for_each(|u| *u = unsure);
            }
        }
    }

    pub fn deliver_late(&mut self, n: usize) -> bool {
        if self.late.is_empty() {
            return false;
        }
        // half the time the newest: a request just a little late races its sender's next one
        let i = if n.is_multiple_of(2) {
            self.late.len() - 1
        } else {
            (n / 2) % self.late.len()
        };
        let r = self.late.remove(i);
        self.say(format!("late delivery of \"{}\"", r.label()));
        self.mark_may_have_expired(&*r);
        self.refresh_unsure(r.label(), r.owner());
        let sent = self.clock.fz();
        let reply = r.resend(&mut self.conns[0]);
        self.copy_arrived(&*r);
        self.note_sent(r.owner());
        self.after_call(None, sent);
        self.say(format!(" -> {reply}"));
        true
    }

    /// A copy of an acquire delivered more than the queue's TTL (the left marks' life, state.lua
    /// `mark_left`) after it was sent, by the server's clock: a mark its attempt left with
    /// may have expired, and the copy may queue or hold a place nobody refreshes (the
    /// documented limit of requests that late). Exempt from the ghost-hold check and counted;
    /// bound: only copies that late.
    fn mark_may_have_expired(&mut self, r: &dyn crate::fuzz::world::Resend) {
        let queue_ttl = (2 * self.cfg.waiter_timeout_ms).max(600_000) as i64;
        if self.server_now_ms() - r.sent_server_ms() <= queue_ttl {
            return;
        }
        let Some((c, t)) = r.owner().and_then(|o| self.thread_of(o)) else {
            return;
        };
        let unsure = self.unsure();
        let th = &mut self.clients[c].threads[t];
        if let Some(lock_attempt) = acquire_of(r.label()) {
            th.lock.unsure_end.insert(lock_attempt, unsure);
        } else if let Some(sem_attempt) = crate::fuzz::sem::sem_acquire_of(r.label()) {
            th.sem.unsure_end.insert(sem_attempt, unsure);
        } else {
            return;
        }
        self.stats
            .add("exempt: late acquire delivered after its mark's life", 1);
    }

    pub fn deliver_all_late(&mut self) {
        while !self.late.is_empty() {
            self.say("; ");
            self.deliver_late(0);
        }
        while !self.late_pops.is_empty() {
            self.say("; ");
            self.deliver_pop(0, 0);
        }
    }

    /// A wake-up popped earlier reaches its client's waiting thread only now (an old one
    /// first, or the newest: a message held up behind others, or just a little late).
    pub fn deliver_pop(&mut self, n: usize, wait_ms: u64) -> bool {
        if self.late_pops.is_empty() {
            return false;
        }
        if wait_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(wait_ms));
        }
        let i = if n.is_multiple_of(2) {
            0
        } else {
            (n / 2) % self.late_pops.len()
        };
        let (c, lock, msg) = self.late_pops.remove(i);
        self.say(format!(
            "c{c} waker gets the held-up wake-up {msg:?} of lock {lock} ({wait_ms}ms more)"
        ));
        self.stats.add("slow wake-up delivered", 1);
        if lock >= crate::fuzz::sem::SEM_POP {
            let sem = lock - crate::fuzz::sem::SEM_POP;
            self.hand_over(Prim::Sem, c, sem, &msg, crate::fuzz::steps::Fault::None);
        } else {
            self.hand_over(Prim::Lock, c, lock, &msg, crate::fuzz::steps::Fault::None);
        }
        true
    }

    // ---- process faults --------------------------------------------------------------------

    pub fn crash(&mut self, c: usize) -> bool {
        if c >= self.clients.len() {
            return false;
        }
        let old = &self.clients[c];
        let (generation, next) = (old.generation + 1, old.next_attempt);
        let mut fresh = Client::new(self.cfg.seed, c, generation, self.cfg.threads);
        fresh.next_attempt = next;
        let unsure = self.unsure();
        self.crashed.insert(old.id.clone(), (c, unsure));
        self.say(format!("c{c} crashes; restarts as {}", fresh.id));
        self.clients[c] = fresh;
        self.stats.add("fault: crash", 1);
        true
    }

    pub fn pause(&mut self, c: usize, ms: u64) -> bool {
        if !self.active(c) {
            return false;
        }
        self.clients[c].paused_until = self.clock.real() + ms as f64;
        self.say(format!("c{c} paused for {ms}ms"));
        self.stats.add("fault: pause", 1);
        true
    }

    pub fn sleep(&mut self, ms: u64) -> bool {
        self.say(format!("time passes: {ms}ms"));
        self.keepalive();
        std::thread::sleep(Duration::from_millis(ms));
        self.keepalive();
        true
    }

    // ---- data faults ------------------------------------------------------------------------

    /// Holds of `lock` that a lost hash or data loss takes from under their holders: exempt.
    /// Whether an operator's forced release of the hold `token` of `lock` (or of semaphore
    /// `sem`) exempts it from the checks: its holder has it in hand (it counts on it until its
    /// next renewal finds it gone), its wake-up was popped and is on its way, or the force may
    /// land late (after a pop). A pending hand-off is not exempt: the force takes its wake-up,
    /// so nobody may hold it after. Counted either way.
    pub fn force_exemption(
        &mut self,
        lock: usize,
        sem: Option<usize>,
        token: u64,
        fault: Fault,
    ) -> bool {
        let in_hand = self.clients.iter().any(|cl| {
            cl.threads.iter().any(|th| {
                let state = if sem.is_some() {
                    &th.sem.state
                } else {
                    &th.lock.state
                };
                matches!(state, State::Holding(h) if h.lock == lock && h.token == token)
            })
        });
        let pop_index = sem.map_or(lock, |s| crate::fuzz::sem::SEM_POP + s);
        let needle = format!("|{token}|");
        let on_its_way = self
            .late_pops
            .iter()
            .any(|(_, l, m)| *l == pop_index && m.contains(&needle));
        let late = matches!(fault, Fault::Late | Fault::SlowFirst);
        let exempt = in_hand || on_its_way || late;
        self.stats.add(
            if exempt {
                "exempt: a forced release's hold (in hand, popped on its way, or forced late)"
            } else {
                "not exempt: a forced release of a hand-off nobody popped"
            },
            1,
        );
        exempt
    }

    /// Holds of `i` that a lost hash or data loss takes from under their holders: exempt.
    pub fn exempt_current_holds(&mut self, p: Prim, i: usize) {
        let mut tokens: Vec<u64> = match p {
            Prim::Lock => vec![self.checker.last[i].token],
            Prim::Sem => self.sem_checker.last[i]
                .holds
                .values()
                .map(|x| x.0)
                .collect(),
        };
        tokens.retain(|&t| t != 0);
        tokens.extend(
            self.clients
                .iter()
                .flat_map(|cl| cl.threads.iter())
                .filter_map(|th| match &th.side(p).state {
                    State::Holding(h) if h.lock == i => Some(h.token),
                    _ => None,
                }),
        );
        for token in tokens {
            match p {
                Prim::Lock => self.checker.exempt(i, token),
                Prim::Sem => {
                    self.sem_checker.exempt[i].insert(token);
                }
            }
        }
    }

    pub fn places_lost(&mut self, p: Prim, i: usize) {
        for cl in &mut self.clients {
            for th in &mut cl.threads {
                if let State::Waiting(w) = &mut th.side_mut(p).state {
                    if w.lock == i {
                        w.place = false;
                    }
                }
            }
        }
    }

    /// The fence of `i` was lost (evicted, or with all data): check 2 may restart.
    fn fence_lost(&mut self, p: Prim, i: usize) {
        match p {
            Prim::Lock => self.checker.fence_lost[i] = true,
            Prim::Sem => self.sem_checker.fence_lost[i] = true,
        }
    }

    /// The owners with an entry in the waiters hash `key` now.
    pub fn waiters_owners(&mut self, key: &str) -> Vec<String> {
        redis::cmd("HKEYS")
            .arg(key)
            .query(&mut self.conns[0])
            .unwrap_or_default()
    }

    /// One key of lock or semaphore `i` is evicted (a lock has no leases or hand-offs key).
    pub fn evict(&mut self, p: Prim, i: usize, key: EvictKey) -> bool {
        if i >= self.count(p) {
            return false;
        }
        let names: Vec<String> = match p {
            Prim::Lock => self.locks[i].key_names().map(str::to_string).to_vec(),
            Prim::Sem => self.sems[i].key_names().map(str::to_string).to_vec(),
        };
        let victim = match key {
            EvictKey::Hash => {
                self.exempt_current_holds(p, i);
                names[0].clone()
            }
            EvictKey::Fence => {
                self.fence_lost(p, i);
                names[1].clone()
            }
            EvictKey::Queue | EvictKey::Waiters => {
                self.places_lost(p, i);
                if key == EvictKey::Queue {
                    let owners = self.waiters_owners(&names[3]);
                    self.queue_lost(p, i)
                        .get_or_insert_with(HashSet::new)
                        .extend(owners);
                }
                names[if key == EvictKey::Queue { 2 } else { 3 }].clone()
            }
            EvictKey::Leases | EvictKey::Handoffs => match p {
                Prim::Lock => return false,
                Prim::Sem => names[if key == EvictKey::Leases { 4 } else { 5 }].clone(),
            },
            EvictKey::Left => {
                // every attempt that ended with a mark may have its late copy act now
                let unsure = self.unsure();
                for cl in &mut self.clients {
                    for th in &mut cl.threads {
                        let side = th.side_mut(p);
                        let marked: Vec<(usize, u64)> =
                            side.marked.iter().filter(|m| m.0 == i).copied().collect();
                        side.unsure_end
                            .extend(marked.into_iter().map(|m| (m, unsure)));
                    }
                }
                format!("{}:left", names[0])
            }
            EvictKey::Wake(c, t) => {
                if c >= self.clients.len() || t >= self.clients[c].threads.len() {
                    return false;
                }
                let owner = self.owner(c, t);
                for th in &mut self.clients[c].threads {
                    if let State::Waiting(w) = &mut th.side_mut(p).state {
                        if let (true, Some(h)) = (w.lock == i, &mut w.handoff) {
                            h.wake_lost = true;
                        }
                    }
                }
                self.wake_key(p, i, &owner)
            }
        };
        let n: i64 = redis::cmd("DEL")
            .arg(&victim)
            .query(&mut self.conns[0])
            .unwrap_or(0);
        self.after_call(None, self.clock.fz());
        self.say(format!(
            "evict {victim}{}",
            if n == 0 { " (absent)" } else { "" }
        ));
        self.stats.add(&format!("fault: {}eviction", p.prefix()), 1);
        true
    }

    pub fn data_loss(&mut self) -> bool {
        for p in Prim::ALL {
            for i in 0..self.count(p) {
                self.exempt_current_holds(p, i);
                self.places_lost(p, i);
                self.fence_lost(p, i);
            }
        }
        for cl in &mut self.clients {
            let upto = cl.next_attempt.saturating_sub(1);
            for th in &mut cl.threads {
                th.marks_lost_upto = upto;
            }
        }
        let conn = &mut self.conns[0];
        let _: redis::RedisResult<()> = redis::cmd("FLUSHALL").query(conn);
        let _: redis::RedisResult<()> = redis::cmd("SCRIPT").arg("FLUSH").query(conn);
        let _: redis::RedisResult<()> = redis::cmd("FUNCTION").arg("FLUSH").query(conn);
        self.after_call(None, self.clock.fz());
        self.say("data loss: FLUSHALL + SCRIPT FLUSH + FUNCTION FLUSH");
        self.stats.add("fault: data loss", 1);
        true
    }

    /// A forward jump of `ms` (minutes), then a heartbeat of every active client on every lock
    /// and semaphore it waits on (`Step::LongClock`).
    pub fn long_clock_step(&mut self, ms: i64) -> bool {
        if !self.clock_step(ms) {
            return false;
        }
        for c in 0..self.clients.len() {
            if !self.active(c) {
                continue;
            }
            for p in Prim::ALL {
                for i in 0..self.count(p) {
                    self.say("; ");
                    self.heartbeat(p, c, i, Fault::None);
                }
            }
        }
        true
    }

    pub fn clock_step(&mut self, ms: i64) -> bool {
        let current = self.server.offset_ms();
        let mut target = current + ms;
        if ms < 0 {
            target = target.max(self.max_offset_ms - MAX_BEHIND_MS);
        }
        if target == current {
            return false;
        }
        self.server.set_offset_ms(target);
        if target < current {
            self.back_steps_ms += current - target;
        }
        if target > current {
            self.clock.step_forward((target - current) as f64);
            for cl in &mut self.clients {
                for th in &mut cl.threads {
                    for p in Prim::ALL {
                        if let State::Waiting(w) = &mut th.side_mut(p).state {
                            w.forward_steps += 1;
                            w.forward_ms += (target - current) as f64;
                        }
                    }
                }
            }
            self.max_offset_ms = self.max_offset_ms.max(target);
        }
        let now = server_time_us(&mut self.conns[0]);
        self.say(format!(
            "server clock steps {:+}ms (offset {target}ms, TIME {now})",
            target - current
        ));
        self.stats.add(
            if target > current {
                "fault: clock step forward"
            } else {
                "fault: clock step back"
            },
            1,
        );
        true
    }
}

/// (lock, attempt) of an acquire request's label ("c0:t1 acquire lock=0 attempt=7").
fn acquire_of(label: &str) -> Option<(usize, u64)> {
    let rest = label.split(" acquire lock=").nth(1)?;
    let (lock, attempt) = rest.split_once(" attempt=")?;
    Some((lock.parse().ok()?, attempt.parse().ok()?))
}
