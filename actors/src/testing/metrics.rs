//! A process-wide metrics recorder whose counters tests read.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

struct Capture {
    snapshotter: Snapshotter,
    totals: Mutex<HashMap<String, u64>>,
}

static CAPTURE: OnceLock<Option<Capture>> = OnceLock::new();

/// Installs a process-wide recorder (once) so tests can read counters.
pub fn capture_metrics() {
    CAPTURE.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let installed = recorder.install().ok();
        // Tests record through kept handles, as the daemon does.
        crate::metrics::keep_handles();
        installed.map(|()| Capture { snapshotter, totals: Mutex::new(HashMap::new()) })
    });
}

/// The total of counter `name` with exactly `labels` since [`capture_metrics`].
pub fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    let Some(Some(capture)) = CAPTURE.get() else {
        return 0;
    };
    let Ok(mut totals) = capture.totals.lock() else {
        return 0;
    };
    // Snapshots drain counters, so they are folded into running totals.
    for (key, _, _, value) in capture.snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(value) = value {
            let labels = key.key().labels().map(|label| (label.key(), label.value()));
            *totals.entry(series_name(key.key().name(), labels)).or_insert(0) += value;
        }
    }
    totals.get(&series_name(name, labels.iter().copied())).copied().unwrap_or(0)
}

/// A series as `name{key=value,…}`, its labels sorted.
pub fn series_name<'a>(name: &str, labels: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut labels: Vec<String> = labels.map(|(key, value)| format!("{key}={value}")).collect();
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}
