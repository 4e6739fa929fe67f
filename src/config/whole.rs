//! Whole-number fields read strictly: the `config` crate would round `2.5`
//! to 3, read `true` as 1 and truncate `"1.9"` from the environment to 1,
//! so a value would reach delayd other than as written.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::Deserialize;

/// An `i64` that deserializes only from a whole number: an integer, a float
/// with no fraction, or (from the environment) a string holding an integer.
struct Whole(i64);

impl<'de> Deserialize<'de> for Whole {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(WholeVisitor).map(Whole)
    }
}

struct WholeVisitor;

impl Visitor<'_> for WholeVisitor {
    type Value = i64;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a whole number")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<i64, E> {
        Ok(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<i64, E> {
        i64::try_from(v).map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<i64, E> {
        // Exact only: 2.0 is 2 as written; 2.5 is not a whole number.
        let whole = v as i64;
        if v.fract() == 0.0 && whole as f64 == v {
            Ok(whole)
        } else {
            Err(E::invalid_type(Unexpected::Float(v), &self))
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<i64, E> {
        v.parse()
            .map_err(|_| E::invalid_value(Unexpected::Str(v), &self))
    }
}

/// For `#[serde(default, deserialize_with = "whole::opt")]` on an
/// `Option<i64>` field.
pub(super) fn opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Option::<Whole>::deserialize(d).map(|w| w.map(|w| w.0))
}

/// For `#[serde(default, deserialize_with = "whole::map")]` on a table of
/// names to whole numbers.
pub(super) fn map<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, i64>>, D::Error> {
    let m = Option::<BTreeMap<String, Whole>>::deserialize(d)?;
    Ok(m.map(|m| m.into_iter().map(|(k, w)| (k, w.0)).collect()))
}
