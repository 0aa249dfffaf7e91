//! The item catalogs: for each spec, every item the suite judges (its numbered conformance
//! summary and every normative statement of its body), as data in `catalog/<spec>.toml`.

use std::collections::BTreeSet;

use serde::Deserialize;

/// How binding an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Level {
    #[serde(rename = "MUST")]
    Must,
    #[serde(rename = "SHOULD")]
    Should,
    #[serde(rename = "MAY")]
    May,
}

impl Level {
    pub fn label(self) -> &'static str {
        match self {
            Level::Must => "MUST",
            Level::Should => "SHOULD",
            Level::May => "MAY",
        }
    }
}

/// One spec item.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Item {
    /// Stable identifier, `<spec>.<name>` (e.g. `bootstrap.C3`, `bootstrap.conf.no-equals`).
    pub id: String,
    /// Where the item comes from in the spec.
    pub section: String,
    pub level: Level,
    /// What the item demands, in the suite's own words.
    pub statement: String,
    /// Names of the tests that cover it.
    #[serde(default)]
    pub tests: Vec<String>,
    /// Why a black-box suite cannot judge this item (it then has no tests and is NOT_RUN).
    #[serde(default)]
    pub out_of_scope: Option<String>,
    /// How the item is judged, where that is not plain from its tests (e.g. from the
    /// network rather than from what the runtime reports), and what changed in it.
    #[serde(default)]
    pub note: Option<String>,
}

/// One spec's catalog.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    /// Short name, the prefix of every item id.
    pub spec: String,
    /// The spec file (in the project's `shared/specs`).
    pub file: String,
    pub title: String,
    #[serde(rename = "item")]
    pub items: Vec<Item>,
}

/// The catalogs shipped with the suite.
const SOURCES: &[(&str, &str)] = &[
    (
        "catalog/bootstrap.toml",
        include_str!("../catalog/bootstrap.toml"),
    ),
    ("catalog/rfc33.toml", include_str!("../catalog/rfc33.toml")),
    (
        "catalog/pmix-rfc0002.toml",
        include_str!("../catalog/pmix-rfc0002.toml"),
    ),
    (
        "catalog/elastic.toml",
        include_str!("../catalog/elastic.toml"),
    ),
];

/// Parses one catalog and checks its ids: unique, prefixed by the spec name.
pub fn parse(path: &str, text: &str) -> Result<Catalog, String> {
    let c: Catalog = toml::from_str(text).map_err(|e| format!("{path}: {e}"))?;
    let mut seen = BTreeSet::new();
    for it in &c.items {
        if !it.id.starts_with(&format!("{}.", c.spec)) {
            return Err(format!(
                "{path}: item {} does not start with the spec name {}.",
                it.id, c.spec
            ));
        }
        if !seen.insert(it.id.as_str()) {
            return Err(format!("{path}: item {} is listed twice", it.id));
        }
        if it.statement.trim().is_empty() || it.statement.contains('\n') {
            return Err(format!(
                "{path}: item {} needs a statement of one line",
                it.id
            ));
        }
        if it.out_of_scope.is_some() && !it.tests.is_empty() {
            return Err(format!(
                "{path}: item {} is out of scope yet names tests",
                it.id
            ));
        }
    }
    Ok(c)
}

/// Every shipped catalog.
pub fn all() -> Result<Vec<Catalog>, String> {
    SOURCES.iter().map(|(p, t)| parse(p, t)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duplicate_or_misprefixed_item_id_is_refused_with_the_file_named() {
        let dup = "spec='x'\nfile='f'\ntitle='t'\n[[item]]\nid='x.a'\nsection='s'\nlevel='MUST'\nstatement='s'\ntests=[]\n[[item]]\nid='x.a'\nsection='s'\nlevel='MUST'\nstatement='s'\ntests=[]\n";
        let e = parse("cat.toml", dup).unwrap_err();
        assert!(e.contains("cat.toml") && e.contains("x.a"), "{e}");
        let bad = dup.replacen("x.a", "y.a", 1);
        assert!(parse("cat.toml", &bad).unwrap_err().contains("y.a"));
        let level = dup.replacen("MUST", "MUSTN'T", 1);
        assert!(parse("cat.toml", &level).unwrap_err().contains("cat.toml"));
    }

    #[test]
    fn shipped_catalogs_parse() {
        let all = all().unwrap();
        assert!(all.iter().any(|c| c.spec == "bootstrap"));
    }
}
