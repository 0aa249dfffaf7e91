//! Reports of a run: `results.json` (versioned schema), JUnit XML and a Markdown table per
//! spec, all built from the per-item records the trials leave behind, so a run split over
//! many processes (nextest) still yields one report.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::catalog::Catalog;
use crate::outcome::Outcome;

/// The reason of an item no trial of this run judged.
const NOT_SELECTED: &str = "not selected in this run";

/// Version of the `results.json` layout; bumped on any incompatible change.
pub const SCHEMA: &str = "dvmlab-conformance-results/1";

/// One test's result within one cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestRecord {
    pub name: String,
    pub outcome: Outcome,
    pub duration_ms: u64,
    /// Expected/observed for a failure, the reason for any other non-pass.
    pub message: Option<String>,
    /// Logs of every host involved, kept for a test that did not pass.
    pub logs: Vec<PathBuf>,
    /// The verdicts of the aspects it judged (outcome, and the message of a non-pass).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub aspects: BTreeMap<String, AspectRecord>,
}

/// One aspect's verdict within a test's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AspectRecord {
    pub outcome: Outcome,
    pub message: Option<String>,
}

/// One item's result within one cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ItemRecord {
    pub id: String,
    pub spec: String,
    pub level: String,
    pub cell: String,
    pub outcome: Outcome,
    pub reason: Option<String>,
    pub duration_ms: u64,
    pub tests: Vec<TestRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProfileInfo {
    pub path: String,
    pub implementation: String,
}

/// `results.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    pub schema: String,
    pub suite_version: String,
    pub profile: ProfileInfo,
    pub backend: String,
    pub cells: Vec<String>,
    pub seed: u64,
    pub items: Vec<ItemRecord>,
    pub totals: BTreeMap<String, usize>,
}

/// Fills in NOT_RUN for every item of every cell without a record, and totals.
pub fn assemble(
    catalogs: &[Catalog],
    cells: &[String],
    mut records: Vec<ItemRecord>,
    profile: ProfileInfo,
    backend: &str,
    seed: u64,
) -> Results {
    let mut items = Vec::new();
    for cell in cells {
        for c in catalogs {
            for it in &c.items {
                let found = records
                    .iter()
                    .position(|r| r.id == it.id && &r.cell == cell)
                    .map(|i| records.swap_remove(i));
                items.push(found.unwrap_or_else(|| ItemRecord {
                    id: it.id.clone(),
                    spec: c.spec.clone(),
                    level: it.level.label().to_string(),
                    cell: cell.clone(),
                    outcome: Outcome::NotRun,
                    reason: Some(match &it.out_of_scope {
                        Some(why) => format!("out of scope: {why}"),
                        None => NOT_SELECTED.into(),
                    }),
                    duration_ms: 0,
                    tests: Vec::new(),
                }));
            }
        }
    }
    let mut totals = BTreeMap::new();
    for o in Outcome::ALL {
        totals.insert(o.label().to_string(), 0);
    }
    for r in &items {
        *totals.entry(r.outcome.label().to_string()).or_default() += 1;
    }
    Results {
        schema: SCHEMA.into(),
        suite_version: env!("CARGO_PKG_VERSION").into(),
        profile,
        backend: backend.into(),
        cells: cells.to_vec(),
        seed,
        items,
        totals,
    }
}

/// The one line of totals a run ends with.
pub fn totals_line(r: &Results) -> String {
    let parts: Vec<String> = Outcome::ALL
        .iter()
        .map(|o| {
            format!(
                "{} {}",
                r.totals.get(o.label()).copied().unwrap_or(0),
                o.label()
            )
        })
        .collect();
    format!("conformance: {}", parts.join(", "))
}

/// Whether the run shows the implementation conformant: every MUST item PASS in every cell
/// (an UNSUPPORTED or NOT_RUN MUST item is not a pass; items out of the suite's scope are
/// listed in the catalog but not counted).
pub fn verdict_line(r: &Results) -> String {
    let reason = |i: &ItemRecord| i.reason.clone().unwrap_or_default();
    let open: Vec<&ItemRecord> = r
        .items
        .iter()
        .filter(|i| i.level == "MUST" && i.outcome != Outcome::Pass)
        .filter(|i| !reason(i).starts_with("out of scope") && reason(i) != NOT_SELECTED)
        .collect();
    let unselected = r
        .items
        .iter()
        .filter(|i| i.level == "MUST" && reason(i) == NOT_SELECTED)
        .count();
    let rest = if unselected > 0 {
        format!(" ({unselected} MUST item(s) not selected in this run)")
    } else {
        String::new()
    };
    if open.is_empty() {
        format!("conformance: every MUST item run PASS{rest}")
    } else {
        format!(
            "conformance: {} MUST item(s) not PASS (not conformant as run): {}{rest}",
            open.len(),
            open.iter()
                .take(8)
                .map(|i| format!("{} [{}] {}", i.id, i.cell, i.outcome))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// A Markdown table per spec (and cell).
pub fn markdown(r: &Results, catalogs: &[Catalog]) -> String {
    let mut s = format!(
        "# Conformance results\n\nImplementation: {} (profile `{}`), backend {}, seed {}.\n\n{}\n\n{}\n",
        r.profile.implementation,
        r.profile.path,
        r.backend,
        r.seed,
        totals_line(r),
        verdict_line(r)
    );
    for cell in &r.cells {
        for c in catalogs {
            let _ = write!(
                s,
                "\n## {} (`{}`), cell {cell}\n\n| Item | Level | Outcome | Time | Tests | Reason |\n|---|---|---|---|---|---|\n",
                c.title, c.file
            );
            for it in r
                .items
                .iter()
                .filter(|i| &i.cell == cell && i.spec == c.spec)
            {
                let tests: Vec<String> = it
                    .tests
                    .iter()
                    .map(|t| format!("`{}` {}", t.name, t.outcome))
                    .collect();
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {:.1} s | {} | {} |",
                    it.id,
                    it.level,
                    it.outcome,
                    it.duration_ms as f64 / 1000.0,
                    tests.join("<br>"),
                    it.reason
                        .as_deref()
                        .unwrap_or("")
                        .lines()
                        .next()
                        .unwrap_or("")
                        .replace('|', "\\|")
                );
            }
        }
    }
    s
}

/// JUnit XML: a suite per spec and cell, a case per item.
pub fn junit(r: &Results) -> Result<String, String> {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let mut report = Report::new("dvmlab-conformance");
    let mut suites: BTreeMap<(String, String), TestSuite> = BTreeMap::new();
    for it in &r.items {
        let suite = suites
            .entry((it.spec.clone(), it.cell.clone()))
            .or_insert_with(|| TestSuite::new(format!("{} [{}]", it.spec, it.cell)));
        let msg = it.reason.clone().unwrap_or_default();
        let status = match it.outcome {
            Outcome::Pass => TestCaseStatus::success(),
            Outcome::Fail => {
                let mut st = TestCaseStatus::non_success(NonSuccessKind::Failure);
                st.set_message(msg.lines().next().unwrap_or("").to_string())
                    .set_description(msg.clone());
                st
            }
            Outcome::Unresolved => {
                let mut st = TestCaseStatus::non_success(NonSuccessKind::Error);
                st.set_message(msg.clone()).set_type("UNRESOLVED");
                st
            }
            Outcome::Unsupported | Outcome::NotRun => {
                let mut st = TestCaseStatus::skipped();
                st.set_message(format!("{}: {msg}", it.outcome));
                st
            }
        };
        let mut case = TestCase::new(it.id.clone(), status);
        case.set_classname(format!("{}.{}", it.spec, it.cell))
            .set_time(Duration::from_millis(it.duration_ms));
        suite.add_test_case(case);
    }
    report.add_test_suites(suites.into_values());
    report.to_string().map_err(|e| format!("JUnit XML: {e}"))
}

/// Writes `results.json`, `junit.xml` and `report.md` into `dir`.
pub fn write_all(dir: &Path, r: &Results, catalogs: &[Catalog]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let json = serde_json::to_string_pretty(r).map_err(|e| e.to_string())?;
    atomic_write(&dir.join("results.json"), &json)?;
    atomic_write(&dir.join("junit.xml"), &junit(r)?)?;
    atomic_write(&dir.join("report.md"), &markdown(r, catalogs))
}

/// Writes through a temporary file and a rename, so concurrent writers never leave a torn
/// file.
pub fn atomic_write(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}
