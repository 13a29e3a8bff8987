//! Serde for durations written as seconds (a number, fractions allowed), for
//! `#[serde(with = "crate::duration_secs")]` fields of the settings.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Writes seconds as a float.
pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64())
}

/// Reads seconds from a number.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let seconds = f64::deserialize(deserializer)?;
    Duration::try_from_secs_f64(seconds).map_err(serde::de::Error::custom)
}
