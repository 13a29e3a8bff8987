//! Admission: how many runs may have a live session, in all and per tenant. A
//! submission takes a [`Slot`] before anything is written; the supervisor keeps it
//! with the run's session and drops it when the session ends, which frees it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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
}

/// A run's place among the active runs; dropping it frees the place.
pub struct Slot {
    _global: Option<OwnedSemaphorePermit>,
    tenant: String,
    tenants: Arc<Mutex<HashMap<String, usize>>>,
}

impl Admission {
    /// `global` runs at once in all, `per_tenant` per tenant (0 = no tenant limit).
    pub fn new(global: usize, per_tenant: usize) -> Self {
        let global_limit = global.max(1);
        Self { global: Arc::new(Semaphore::new(global_limit)), global_limit, per_tenant, tenants: Arc::default() }
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
        Ok(Slot { _global: Some(permit), tenant: tenant.to_owned(), tenants: self.tenants.clone() })
    }

    /// A slot for a run admitted by an earlier process: it counts against the
    /// limits, but is never refused (it takes a global place only if one is free).
    pub fn readmit(&self, tenant: &str) -> Slot {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        *tenants.entry(tenant.to_owned()).or_insert(0) += 1;
        let permit = self.global.clone().try_acquire_owned().ok();
        Slot { _global: permit, tenant: tenant.to_owned(), tenants: self.tenants.clone() }
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
