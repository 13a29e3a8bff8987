//! Open event streams, counted in all and per tenant against their limits; a
//! stream holds its place until it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use troupe_actors::metrics;

/// Open event streams, in all and per tenant.
pub struct StreamSlots {
    inner: Arc<Mutex<SlotCounts>>,
    global_limit: usize,
    tenant_limit: usize,
}

#[derive(Default)]
struct SlotCounts {
    total: usize,
    tenants: HashMap<String, usize>,
}

/// One open stream; dropping it frees its place.
pub struct StreamSlot {
    inner: Arc<Mutex<SlotCounts>>,
    tenant: String,
}

impl StreamSlots {
    pub fn new(global_limit: usize, tenant_limit: usize) -> Self {
        Self { inner: Arc::default(), global_limit, tenant_limit }
    }

    /// A place for a stream of `tenant`, if both limits allow one.
    pub fn open(&self, tenant: &str) -> Option<StreamSlot> {
        let mut counts = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.total >= self.global_limit {
            metrics::sse_rejected("global");
            return None;
        }
        let mine = counts.tenants.get(tenant).copied().unwrap_or(0);
        if mine >= self.tenant_limit {
            metrics::sse_rejected("tenant");
            return None;
        }
        counts.total += 1;
        counts.tenants.insert(tenant.to_owned(), mine + 1);
        metrics::sse_clients(1.0);
        Some(StreamSlot { inner: self.inner.clone(), tenant: tenant.to_owned() })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut counts = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        counts.total = counts.total.saturating_sub(1);
        if let Some(mine) = counts.tenants.get_mut(&self.tenant) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                counts.tenants.remove(&self.tenant);
            }
        }
        metrics::sse_clients(-1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_slots_hold_both_limits_and_free_on_drop() {
        let slots = StreamSlots::new(3, 2);
        let a1 = slots.open("a").unwrap();
        let _a2 = slots.open("a").unwrap();
        assert!(slots.open("a").is_none(), "tenant limit");
        let _b1 = slots.open("b").unwrap();
        assert!(slots.open("b").is_none(), "global limit");
        drop(a1);
        assert!(slots.open("b").is_some());
    }
}
