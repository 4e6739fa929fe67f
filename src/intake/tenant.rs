//! Which tenant an intake message belongs to, on a business with tenants
//! and a `tenant_header` (docs/tenants.md): the header's value when it can
//! name a tenant, else none (the writer puts it in the default tenant).

use lapin::types::{AMQPValue, FieldTable};

use crate::config::intake_settings::names_a_tenant;

/// The tenant `header` names in `headers`: a string of 1 to 200 bytes of UTF-8 text without control characters.
/// Anything else (missing, empty, too long, binary, another type) names
/// none: the message is stored all the same, never refused for it.
pub fn tenant_of(headers: Option<&FieldTable>, header: &str) -> Option<Vec<u8>> {
    let value = headers?.inner().get(header)?;
    let bytes: &[u8] = match value {
        AMQPValue::LongString(s) => s.as_bytes(),
        AMQPValue::ShortString(s) => s.as_str().as_bytes(),
        _ => return None,
    };
    names_a_tenant(bytes).then(|| bytes.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{LongString, ShortString};

    fn with(value: AMQPValue) -> FieldTable {
        let mut t = FieldTable::default();
        t.insert(ShortString::from("x-tenant"), value);
        t
    }

    #[test]
    fn only_short_printable_strings_name_a_tenant() {
        let named = |v: AMQPValue| tenant_of(Some(&with(v)), "x-tenant");
        assert_eq!(
            named(AMQPValue::LongString(LongString::from("acme"))),
            Some(b"acme".to_vec())
        );
        assert_eq!(
            named(AMQPValue::ShortString(ShortString::from("acmé"))),
            Some("acmé".as_bytes().to_vec())
        );
        assert_eq!(named(AMQPValue::LongString(LongString::from(""))), None);
        assert_eq!(
            named(AMQPValue::LongString(LongString::from("x".repeat(201)))),
            None
        );
        assert!(named(AMQPValue::LongString(LongString::from("x".repeat(200)))).is_some());
        assert_eq!(
            named(AMQPValue::LongString(LongString::from(vec![0xff, 0x00]))),
            None
        );
        assert_eq!(named(AMQPValue::LongString(LongString::from("a\nb"))), None);
        assert_eq!(named(AMQPValue::LongLongInt(7)), None);
        assert_eq!(tenant_of(None, "x-tenant"), None);
        assert_eq!(tenant_of(Some(&FieldTable::default()), "x-tenant"), None);
    }
}
