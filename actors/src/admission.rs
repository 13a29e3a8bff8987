//! Admission: how many runs may have a live session, in all and per tenant, and
//! how many may wait for one. A submission takes a [`Slot`] before anything is
//! written; the supervisor keeps it with the run's session and drops it when the
//! session ends, which frees it and wakes the [`RunQueue`]'s dispatcher. A run
//! that finds no slot waits in the queue (stored as `queued`) while the queue has
//! room, and is refused otherwise.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::protocol::RunId;

/// Why no slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot of the runtime is taken.
    Global {
        /// The limit.
        limit: usize,
    },
    /// Every slot of the tenant is taken.
    Tenant {
        /// The limit.
        limit: usize,
    },
}

/// The slots.
pub struct Admission {
    global: Arc<Semaphore>,
    global_limit: usize,
    per_tenant: usize,
    tenants: Arc<Mutex<HashMap<String, usize>>>,
    freed: Arc<Notify>,
}

/// A run's place among the active runs; dropping it frees the place.
pub struct Slot {
    global: Option<OwnedSemaphorePermit>,
    tenant: String,
    tenants: Arc<Mutex<HashMap<String, usize>>>,
    freed: Arc<Notify>,
}

impl Admission {
    /// `global` runs at once in all, `per_tenant` per tenant (0 = no tenant limit).
    pub fn new(global: usize, per_tenant: usize) -> Self {
        let global_limit = global.max(1);
        Self {
            global: Arc::new(Semaphore::new(global_limit)),
            global_limit,
            per_tenant,
            tenants: Arc::default(),
            freed: Arc::new(Notify::new()),
        }
    }

    /// Notified whenever a slot is freed (and when a run is queued).
    pub fn freed(&self) -> Arc<Notify> {
        self.freed.clone()
    }

    /// A slot for a new run of `tenant`, or why not.
    pub fn try_admit(&self, tenant: &str) -> Result<Slot, Refusal> {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        let count = tenants.get(tenant).copied().unwrap_or(0);
        if self.per_tenant > 0 && count >= self.per_tenant {
            return Err(Refusal::Tenant { limit: self.per_tenant });
        }
        let permit =
            self.global.clone().try_acquire_owned().map_err(|_| Refusal::Global { limit: self.global_limit })?;
        tenants.insert(tenant.to_owned(), count + 1);
        Ok(self.slot(Some(permit), tenant))
    }

    /// A slot for a run admitted by an earlier process: it counts against the
    /// limits, but is never refused (it takes a global place only if one is free).
    pub fn readmit(&self, tenant: &str) -> Slot {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        *tenants.entry(tenant.to_owned()).or_insert(0) += 1;
        let permit = self.global.clone().try_acquire_owned().ok();
        self.slot(permit, tenant)
    }

    fn slot(&self, permit: Option<OwnedSemaphorePermit>, tenant: &str) -> Slot {
        Slot { global: permit, tenant: tenant.to_owned(), tenants: self.tenants.clone(), freed: self.freed.clone() }
    }

    /// Runs of `tenant` holding a slot.
    pub fn active(&self, tenant: &str) -> usize {
        self.tenants.lock().unwrap_or_else(PoisonError::into_inner).get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = tenants.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                tenants.remove(&self.tenant);
            }
        }
        drop(tenants);
        // Both places are free before anyone is woken to take one.
        drop(self.global.take());
        self.freed.notify_one();
    }
}

/// Why a run could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueFull {
    /// The queue holds `limit` runs.
    Global {
        /// The limit.
        limit: usize,
    },
    /// The tenant has `limit` runs queued.
    Tenant {
        /// The limit.
        limit: usize,
    },
}

/// Runs waiting for a slot, oldest first. Bounded in all and per tenant, so one
/// tenant cannot fill it.
pub struct RunQueue {
    waiting: Mutex<VecDeque<(RunId, String)>>,
    limit: usize,
    per_tenant: usize,
}

impl RunQueue {
    /// A queue of at most `limit` runs, `per_tenant` of one tenant (0 = no
    /// tenant limit).
    pub fn new(limit: usize, per_tenant: usize) -> Self {
        Self { waiting: Mutex::default(), limit, per_tenant }
    }

    /// Whether a run of `tenant` would be queued.
    pub fn has_room(&self, tenant: &str) -> Result<(), QueueFull> {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        Self::room(&waiting, self.limit, self.per_tenant, tenant)
    }

    fn room(
        waiting: &VecDeque<(RunId, String)>,
        limit: usize,
        per_tenant: usize,
        tenant: &str,
    ) -> Result<(), QueueFull> {
        if waiting.len() >= limit {
            return Err(QueueFull::Global { limit });
        }
        if per_tenant > 0 && waiting.iter().filter(|(_, owner)| owner == tenant).count() >= per_tenant {
            return Err(QueueFull::Tenant { limit: per_tenant });
        }
        Ok(())
    }

    /// Adds a run at the back. `force` skips the bounds (runs queued by an
    /// earlier process).
    pub fn push(&self, run_id: RunId, tenant: &str, force: bool) -> Result<(), QueueFull> {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if !force {
            Self::room(&waiting, self.limit, self.per_tenant, tenant)?;
        }
        waiting.push_back((run_id, tenant.to_owned()));
        Ok(())
    }

    /// Puts a run back at the front (it could not be started just now).
    pub fn push_front(&self, run_id: RunId, tenant: &str) {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner).push_front((run_id, tenant.to_owned()));
    }

    /// Whether some queued run could take a slot that is free now: one whose
    /// tenant is under its own limit.
    pub fn any_admissible(&self, admission: &Admission) -> bool {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        waiting.iter().any(|(_, tenant)| admission.per_tenant == 0 || admission.active(tenant) < admission.per_tenant)
    }

    /// Takes a run out (it was cancelled); whether it was there.
    pub fn remove(&self, run_id: RunId) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let before = waiting.len();
        waiting.retain(|(queued, _)| *queued != run_id);
        waiting.len() != before
    }

    /// Runs waiting.
    pub fn len(&self) -> usize {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no run waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The oldest run that can be admitted now, with its slot: a tenant at its
    /// own limit does not hold up the others.
    pub fn take_admissible(&self, admission: &Admission) -> Option<(RunId, Slot)> {
        self.take_admissible_with_tenant(admission).map(|(run_id, _, slot)| (run_id, slot))
    }

    /// [`Self::take_admissible`], with the run's tenant.
    pub fn take_admissible_with_tenant(&self, admission: &Admission) -> Option<(RunId, String, Slot)> {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        for index in 0..waiting.len() {
            match admission.try_admit(&waiting[index].1) {
                Ok(slot) => return waiting.remove(index).map(|(run_id, tenant)| (run_id, tenant, slot)),
                Err(Refusal::Tenant { .. }) => continue,
                Err(Refusal::Global { .. }) => return None,
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_hands_out_the_oldest_admissible_run_and_holds_its_bounds() {
        let admission = Admission::new(2, 1);
        let queue = RunQueue::new(3, 2);
        let (a1, a2, b1) = (RunId::new(), RunId::new(), RunId::new());
        queue.push(a1, "a", false).unwrap();
        queue.push(a2, "a", false).unwrap();
        assert_eq!(queue.push(RunId::new(), "a", false), Err(QueueFull::Tenant { limit: 2 }));
        queue.push(b1, "b", false).unwrap();
        assert_eq!(queue.has_room("c"), Err(QueueFull::Global { limit: 3 }));

        let (first, slot_a) = queue.take_admissible(&admission).unwrap();
        assert_eq!(first, a1);
        // `a` is at its limit: `b` goes ahead of a2.
        let (second, _slot_b) = queue.take_admissible(&admission).unwrap();
        assert_eq!(second, b1);
        assert!(queue.take_admissible(&admission).is_none());
        drop(slot_a);
        assert_eq!(queue.take_admissible(&admission).map(|(run_id, _)| run_id), Some(a2));
        assert!(queue.is_empty());
    }

    #[test]
    fn a_tenant_at_its_limit_is_refused_while_others_are_admitted() {
        let admission = Admission::new(3, 2);
        let a1 = admission.try_admit("a").unwrap();
        let _a2 = admission.try_admit("a").unwrap();
        assert_eq!(admission.try_admit("a").err(), Some(Refusal::Tenant { limit: 2 }));
        let _b1 = admission.try_admit("b").unwrap();
        assert_eq!(admission.try_admit("b").err(), Some(Refusal::Global { limit: 3 }));
        drop(a1);
        assert_eq!(admission.active("a"), 1);
        assert!(admission.try_admit("b").is_ok(), "a freed slot is given again");
    }

    #[test]
    fn readmitted_runs_count_but_are_never_refused() {
        let admission = Admission::new(1, 1);
        let _old = admission.readmit("a");
        let _older = admission.readmit("a");
        assert_eq!(admission.active("a"), 2);
        assert_eq!(admission.try_admit("a").err(), Some(Refusal::Tenant { limit: 1 }));
        assert_eq!(admission.try_admit("b").err(), Some(Refusal::Global { limit: 1 }));
    }
}
