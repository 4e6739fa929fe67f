//! `tenants = true` and its per-tenant tables (`tenant_weights`,
//! `tenant_max_rate`): what a business with tenants is configured with,
//! and the settings an operator may also change at run time.

use super::*;

/// A business with tenants: each task waits in its tenant's sorted set, and
/// due members leave weighted-fair among the tenants that have some.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenants {
    /// Weights of the named tenants; every other tenant weighs 1.
    pub weights: std::collections::BTreeMap<String, u32>,
    /// Members per second the named tenants are released at most, shared
    /// by every instance; every other tenant has no cap of its own.
    pub max_rates: std::collections::BTreeMap<String, u32>,
    /// Most unconfirmed publishes of any one tenant on each instance and
    /// key, so the window is never all one tenant's (`tenant_window`).
    pub window: Option<u32>,
}

impl Tenants {
    /// The share weight of `tenant`: set in the config, else 1.
    pub fn weight(&self, tenant: &[u8]) -> u32 {
        std::str::from_utf8(tenant)
            .ok()
            .and_then(|t| self.weights.get(t).copied())
            .unwrap_or(1)
    }

    /// The `max_rate` of `tenant`, if the config sets one.
    pub fn max_rate(&self, tenant: &[u8]) -> Option<u32> {
        std::str::from_utf8(tenant)
            .ok()
            .and_then(|t| self.max_rates.get(t).copied())
    }
}

/// A per-tenant setting an operator can also set at run time, in place of
/// the config's value for that tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantSetting {
    /// Its share weight (`tenant_weights`).
    Weight,
    /// Its `max_rate`, members a second over every key (`tenant_max_rate`).
    MaxRate,
}

impl TenantSetting {
    /// The field's name in the API and the CLI.
    pub fn field(self) -> &'static str {
        match self {
            Self::Weight => "weight",
            Self::MaxRate => "max_rate",
        }
    }

    /// The config's table of it, per tenant.
    pub fn section(self) -> &'static str {
        match self {
            Self::Weight => "tenant_weights",
            Self::MaxRate => "tenant_max_rate",
        }
    }

    /// What the audit log names a change of it.
    pub fn audit_action(self) -> &'static str {
        match self {
            Self::Weight => "tenant_weight",
            Self::MaxRate => "tenant_max_rate",
        }
    }

    /// The largest value it takes (the smallest is 1).
    pub fn most(self) -> u32 {
        match self {
            Self::Weight => 1000,
            Self::MaxRate => 10_000_000,
        }
    }
}

impl Tenants {
    /// `tenant`'s value of `setting` in the config (a weight is always
    /// set: 1 unless named).
    pub fn configured(&self, setting: TenantSetting, tenant: &[u8]) -> Option<u32> {
        match setting {
            TenantSetting::Weight => Some(self.weight(tenant)),
            TenantSetting::MaxRate => self.max_rate(tenant),
        }
    }
}

/// `tenants = true` and its `[businesses.NAME.tenant_weights]` and
/// `[businesses.NAME.tenant_max_rate]`: weights from 1 to 1000, rates from
/// 1 to 10,000,000 a second, and only on a business with tenants.
pub(super) fn tenants(
    name: &str,
    rb: &mut RawBusiness,
    problems: &mut Vec<String>,
) -> Option<Tenants> {
    let weights = (TenantSetting::Weight, rb.tenant_weights.take());
    let rates = (TenantSetting::MaxRate, rb.tenant_max_rate.take());
    let window = rb.tenant_window.take();
    if rb.tenants != Some(true) {
        for (setting, set) in [&weights, &rates] {
            if set.as_ref().is_some_and(|s| !s.is_empty()) {
                let section = setting.section();
                problems.push(format!("business \"{name}\", section \"{section}\" needs tenants = true; add it or remove the section"));
            }
        }
        if window.is_some() {
            problems.push(format!("business \"{name}\", tenant_window needs tenants = true; add it or remove tenant_window"));
        }
        return None;
    }
    let window = window.and_then(|w| match u32::try_from(w) {
        Ok(w) if (1..=100_000).contains(&w) => Some(w),
        _ => {
            problems.push(format!(
                "business \"{name}\", tenant_window must be from 1 to 100000 (got {w})"
            ));
            None
        }
    });
    Some(Tenants {
        weights: per_tenant(name, weights, problems),
        max_rates: per_tenant(name, rates, problems),
        window,
    })
}

/// One per-tenant section's values, each from 1 to its setting's most; a
/// value out of range is a problem naming the tenant.
fn per_tenant(
    name: &str,
    (setting, raw): (
        TenantSetting,
        Option<std::collections::BTreeMap<String, i64>>,
    ),
    problems: &mut Vec<String>,
) -> std::collections::BTreeMap<String, u32> {
    let (section, max) = (setting.section(), setting.most());
    let mut out = std::collections::BTreeMap::new();
    for (tenant, v) in raw.unwrap_or_default() {
        match u32::try_from(v) {
            Ok(v) if (1..=max).contains(&v) => {
                out.insert(tenant, v);
            }
            _ => problems.push(format!(
                "business \"{name}\", {section}.\"{tenant}\" must be from 1 to {max} (got {v})"
            )),
        }
    }
    out
}
