//! The libtest-compatible runner: one trial per catalog item (per matrix cell), plus the
//! suite's own consistency checks (`meta.*`). A trial runs the tests its item names; a test
//! named by several items runs once per cell and process and its result is shared. Trials a
//! filter excludes build nothing.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

use crate::catalog::{self, Catalog, Item};
use crate::checks::{self, TestDef};
use crate::knobs::{Cell, Knobs};
use crate::outcome::{Outcome, Problem};
use crate::profile::Profile;
use crate::report::{self, AspectRecord, ItemRecord, ProfileInfo, Results, TestRecord};
use crate::sut::Ctx;
use crate::traceability;

/// Lines of each host's log printed with a failure.
const LOG_TAIL: usize = 30;

/// A test's result in one cell, computed once and shared by every item that names it.
type SharedResult = Arc<OnceLock<TestRecord>>;

struct Suite {
    profile: Arc<Profile>,
    knobs: Knobs,
    catalogs: Vec<Catalog>,
    tests: HashMap<&'static str, TestDef>,
    results: Mutex<HashMap<(String, String), SharedResult>>,
    built: OnceLock<Result<(), String>>,
    out: PathBuf,
    run_id: String,
}

fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// Says loudly that a test could not run here (and why), also into `DVMLAB_SKIP_LOG`.
fn announce_skip(test: &str, why: &str) {
    eprintln!("\n!!!! NOT RUN {test}: {why} !!!!\n");
    if let Some(path) = std::env::var_os("DVMLAB_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "NOT RUN (conformance) {test}: {why}");
        }
    }
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Suite {
    fn records_dir(&self, cell: &Cell) -> PathBuf {
        self.out
            .join("records")
            .join(&self.run_id)
            .join(cell.name())
    }

    /// Runs test `def` in `cell` (once per process; reused from another process of the same
    /// nextest run if that one already recorded it).
    fn test_result(&self, cell: &Cell, def: &TestDef) -> TestRecord {
        let slot = {
            let mut m = self.results.lock().unwrap_or_else(|e| e.into_inner());
            m.entry((cell.name(), def.name.to_string()))
                .or_default()
                .clone()
        };
        slot.get_or_init(|| {
            let file = self
                .records_dir(cell)
                .join("tests")
                .join(format!("{}.json", def.name));
            // A result another process of this run recorded is reused, unless it did not
            // pass: a retry (nextest --retries) must run the test again.
            if let Some(r) = std::fs::read_to_string(&file)
                .ok()
                .and_then(|t| serde_json::from_str::<TestRecord>(&t).ok())
                .filter(|r| !matches!(r.outcome, Outcome::Fail | Outcome::Unresolved))
            {
                return r;
            }
            let r = self.execute(cell, def);
            if let Some(dir) = file.parent() {
                let _ = std::fs::create_dir_all(dir);
                if let Ok(t) = serde_json::to_string(&r) {
                    let _ = report::atomic_write(&file, &t);
                }
            }
            r
        })
        .clone()
    }

    fn execute(&self, cell: &Cell, def: &TestDef) -> TestRecord {
        let started = Instant::now();
        let built = self.built.get_or_init(|| self.profile.build());
        let ctx = Ctx::new(self.profile.clone(), *cell, self.knobs.seed, def.name);
        let verdict = match built {
            Err(e) => Err(Problem::Unresolved(e.clone())),
            Ok(()) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (def.run)(&ctx)))
                .unwrap_or_else(|p| {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    Err(Problem::Unresolved(format!("the test panicked: {msg}")))
                }),
        };
        let undeclared: Vec<String> = ctx
            .aspects()
            .into_keys()
            .filter(|a| !def.aspects.contains(&a.as_str()))
            .collect();
        let verdict = if undeclared.is_empty() {
            verdict
        } else {
            Err(Problem::Unresolved(format!(
                "the test judged aspects it does not declare (a bug in the suite): {undeclared:?}"
            )))
        };
        let verdict = in_this_environment(def.name, verdict);
        let aspects: BTreeMap<String, AspectRecord> = ctx
            .aspects()
            .into_iter()
            .map(|(name, v)| {
                let v = in_this_environment(&format!("{}/{name}", def.name), v);
                let outcome = v.as_ref().err().map_or(Outcome::Pass, Problem::outcome);
                let message = v.err().map(|p| p.to_string());
                (name, AspectRecord { outcome, message })
            })
            .collect();
        let outcome = verdict
            .as_ref()
            .err()
            .map_or(Outcome::Pass, Problem::outcome);
        let mut logs = Vec::new();
        let keep = matches!(outcome, Outcome::Fail | Outcome::Unresolved)
            || aspects
                .values()
                .any(|a| matches!(a.outcome, Outcome::Fail | Outcome::Unresolved));
        for c in ctx.clusters() {
            if keep {
                let dest = self
                    .out
                    .join("logs")
                    .join(cell.name())
                    .join(def.name)
                    .join(&c.label);
                let _ = std::fs::create_dir_all(&dest);
                for h in &c.hosts {
                    let src = c.run_dir.join(format!("{h}.log"));
                    if src.exists() {
                        let to = dest.join(format!("{h}.log"));
                        if std::fs::copy(&src, &to).is_ok() {
                            logs.push(to);
                        }
                    }
                }
            }
            if let Err(e) = dvmlab_harness::rundir::remove_kept(&c.run_dir) {
                eprintln!("conformance: {e}");
            }
        }
        let notes = ctx.notes();
        let with_notes = |mut m: String| {
            if !notes.is_empty() {
                m.push_str("\nwhat happened:\n");
                for n in &notes {
                    m.push_str(&format!("  {n}\n"));
                }
            }
            m
        };
        let aspects = aspects
            .into_iter()
            .map(|(name, mut a)| {
                a.message = a.message.map(with_notes);
                (name, a)
            })
            .collect();
        let message = verdict.err().map(|p| {
            let mut m = p.to_string();
            m = with_notes(m);
            if keep && def.seeded {
                m.push_str(&format!(
                    "\nreplay this run's fault schedule with DVMLAB_SEED={}\n",
                    self.knobs.seed
                ));
            }
            m
        });
        TestRecord {
            name: def.name.to_string(),
            outcome,
            duration_ms: started.elapsed().as_millis() as u64,
            message,
            logs,
            aspects,
        }
    }

    /// The record of one catalog entry: a test (its premise), or `TEST/ASPECT` (the premise,
    /// then that aspect).
    fn entry_record(&self, cell: &Cell, entry: &str) -> TestRecord {
        let (name, aspect) = match entry.split_once('/') {
            Some((t, a)) => (t, Some(a)),
            None => (entry, None),
        };
        let Some(def) = self.tests.get(name) else {
            return TestRecord {
                name: entry.to_string(),
                outcome: Outcome::Unresolved,
                duration_ms: 0,
                message: Some(format!(
                    "the catalog names test {name}, which does not exist"
                )),
                logs: Vec::new(),
                aspects: BTreeMap::new(),
            };
        };
        let mut r = self.test_result(cell, def);
        let Some(aspect) = aspect else {
            return r;
        };
        r.name = entry.to_string();
        if r.outcome != Outcome::Pass {
            return r;
        }
        match r.aspects.get(aspect) {
            Some(a) => {
                r.outcome = a.outcome;
                r.message = a.message.clone();
            }
            None => {
                r.outcome = Outcome::Unresolved;
                r.message = Some(format!(
                    "test {name} passed without judging its aspect {aspect}"
                ));
            }
        }
        if r.outcome == Outcome::Pass {
            r.logs.clear();
        }
        r
    }

    fn run_item(&self, cell: &Cell, spec: &str, item: &Item) -> Result<Completion, Failed> {
        if let Some(why) = &item.out_of_scope {
            return Ok(Completion::ignored_with(format!(
                "NOT_RUN: out of scope: {why}"
            )));
        }
        let started = Instant::now();
        let tests: Vec<TestRecord> = item
            .tests
            .iter()
            .map(|entry| self.entry_record(cell, entry))
            .collect();
        let outcome = Outcome::combine(&tests.iter().map(|t| t.outcome).collect::<Vec<_>>());
        let reason = tests
            .iter()
            .filter(|t| t.outcome == outcome && outcome != Outcome::Pass)
            .filter_map(|t| t.message.as_ref().map(|m| format!("{}: {m}", t.name)))
            .collect::<Vec<_>>()
            .join("\n");
        let record = ItemRecord {
            id: item.id.clone(),
            spec: spec.to_string(),
            level: item.level.label().to_string(),
            cell: cell.name(),
            outcome,
            reason: (!reason.is_empty()).then_some(reason.clone()),
            duration_ms: started.elapsed().as_millis() as u64,
            tests: tests.clone(),
        };
        let file = self
            .records_dir(cell)
            .join("items")
            .join(format!("{}.json", item.id));
        if let Some(dir) = file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Ok(t) = serde_json::to_string(&record) {
            let _ = report::atomic_write(&file, &t);
        }
        if let Some(expected) = self.profile.expected.get(&item.id) {
            let why = &expected.why;
            let as_expected = expected
                .observed
                .as_ref()
                .is_none_or(|words| reason.contains(words.as_str()));
            return match outcome {
                Outcome::Fail if as_expected => Ok(Completion::ignored_with(format!(
                    "XFAIL (expected: {why}): {}",
                    first_line(&reason)
                ))),
                Outcome::Fail => {
                    let m = format!(
                        "{} [{}] FAILs, but not as expected ({why}: its report should say {:?}):\n{reason}\nupdate {} if this is the library's doing",
                        item.id,
                        cell.name(),
                        expected.observed.as_deref().unwrap_or_default(),
                        self.profile.expected_path.display()
                    );
                    eprintln!("{m}");
                    Err(Failed::from(m))
                }
                other => {
                    let m = format!(
                        "{} [{}] is expected to FAIL ({why}) but is {other}{}: update {}",
                        item.id,
                        cell.name(),
                        if reason.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", first_line(&reason))
                        },
                        self.profile.expected_path.display()
                    );
                    eprintln!("{m}");
                    Err(Failed::from(m))
                }
            };
        }
        match outcome {
            Outcome::Pass => Ok(Completion::Completed),
            Outcome::Unsupported | Outcome::NotRun => Ok(Completion::ignored_with(format!(
                "{outcome}: {}",
                first_line(&reason)
            ))),
            Outcome::Fail | Outcome::Unresolved => {
                let mut m = format!(
                    "{outcome} {} [{}] ({} {}): {}\n{reason}\n",
                    item.id,
                    cell.name(),
                    item.level.label(),
                    item.section,
                    item.statement
                );
                for t in &tests {
                    for l in &t.logs {
                        m.push_str(&format!(
                            "---- {} (last {LOG_TAIL} lines) ----\n{}\n",
                            l.display(),
                            tail(l, LOG_TAIL)
                        ));
                    }
                }
                eprintln!("{m}");
                Err(Failed::from(m))
            }
        }
    }

    fn collect_records(&self) -> Vec<ItemRecord> {
        let mut v = Vec::new();
        for cell in &self.knobs.cells {
            let dir = self.records_dir(cell).join("items");
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if let Some(r) = std::fs::read_to_string(e.path())
                    .ok()
                    .and_then(|t| serde_json::from_str::<ItemRecord>(&t).ok())
                {
                    v.push(r);
                }
            }
        }
        v
    }
}

/// A test's (or aspect's) verdict as this environment takes it: a test that cannot run here
/// says so loudly, and in CI it is unresolved instead, so CI cannot pass by skipping.
fn in_this_environment(name: &str, v: crate::outcome::Verdict) -> crate::outcome::Verdict {
    match v {
        Err(Problem::NotRun(why)) if in_ci() => Err(Problem::Unresolved(format!(
            "may not be skipped in CI: {why}"
        ))),
        Err(Problem::NotRun(why)) => {
            announce_skip(name, &why);
            Err(Problem::NotRun(why))
        }
        v => v,
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn meta_trials(catalogs: &[Catalog], registered: Vec<String>, regenerating: bool) -> Vec<Trial> {
    let cats = catalogs.to_vec();
    let cats2 = catalogs.to_vec();
    vec![
        Trial::test("meta.catalog-coverage", move || {
            let p = traceability::coverage_problems(&cats, &registered);
            if p.is_empty() {
                Ok(())
            } else {
                Err(p.join("\n").into())
            }
        }),
        Trial::ignorable_test("meta.traceability-matrix-is-current", move || {
            if regenerating {
                return Ok(Completion::ignored_with("the matrix is being regenerated"));
            }
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(traceability::FILE);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                format!(
                    "{}: {e}; generate it with `make traceability`",
                    path.display()
                )
            })?;
            match traceability::staleness(&cats2, &text) {
                None => Ok(Completion::Completed),
                Some(why) => Err(why.into()),
            }
        }),
    ]
}

/// What a caller may set instead of the environment (the suite's own tests use it to run
/// the suite against deliberately broken implementations).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub profile: Option<PathBuf>,
    pub results: Option<PathBuf>,
    /// Cells and seed instead of `DVMLAB_*`.
    pub knobs: Option<Knobs>,
    /// Rewrite `TRACEABILITY.md` with this run's results.
    pub write_traceability: bool,
    /// Several name filters, as libtest takes them: a trial runs if any matches (exactly,
    /// with `--exact`). One filter may as well stay in the arguments.
    pub filters: Vec<String>,
}

/// libtest options that take a value as the next word.
const VALUED: &[&str] = &[
    "--skip",
    "--logfile",
    "--test-threads",
    "--color",
    "--format",
    "-Z",
];

/// Splits a command line into the arguments `libtest-mimic` parses and the name filters:
/// libtest accepts any number of filters, `libtest-mimic` only one.
pub fn split_filters(argv: Vec<String>) -> (Arguments, Vec<String>) {
    let mut rest = Vec::new();
    let mut filters = Vec::new();
    let mut words = argv.into_iter();
    rest.extend(words.next());
    while let Some(w) = words.next() {
        if VALUED.contains(&w.as_str()) {
            rest.push(w);
            rest.extend(words.next());
        } else if w.starts_with('-') {
            rest.push(w);
        } else {
            filters.push(w);
        }
    }
    (Arguments::from_iter(rest), filters)
}

fn setup(over: &Overrides) -> Result<Suite, String> {
    let catalogs = catalog::all()?;
    let knobs = match &over.knobs {
        Some(k) => k.clone(),
        None => Knobs::from_env()?,
    };
    let profile = Arc::new(match &over.profile {
        Some(p) => Profile::load(p)?,
        None => Profile::from_env()?,
    });
    let tests: HashMap<&'static str, TestDef> =
        checks::all().into_iter().map(|t| (t.name, t)).collect();
    let out = over
        .results
        .clone()
        .or_else(|| std::env::var_os("DVMLAB_RESULTS").map(PathBuf::from))
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().unwrap_or_default();
            // <target>/<profile>/deps/<binary> → <target>/conformance
            exe.ancestors()
                .nth(3)
                .map(|t| t.join("conformance"))
                .unwrap_or_else(|| PathBuf::from("conformance-results"))
        });
    let run_id = std::env::var("NEXTEST_RUN_ID").unwrap_or_else(|_| {
        format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0)
        )
    });
    if let Some(id) = profile.expected.keys().find(|id| {
        !catalogs
            .iter()
            .any(|c| c.items.iter().any(|i| &i.id == *id))
    }) {
        return Err(format!(
            "expectations {}: {id} is no item of any catalog",
            profile.expected_path.display()
        ));
    }
    prune_old_records(&out.join("records"));
    Ok(Suite {
        profile,
        knobs,
        catalogs,
        tests,
        results: Mutex::new(HashMap::new()),
        built: OnceLock::new(),
        out,
        run_id,
    })
}

/// Removes the records of runs that ended long ago (each run, or nextest run, has its own).
fn prune_old_records(dir: &Path) {
    const OLD: std::time::Duration = std::time::Duration::from_secs(12 * 3600);
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > OLD);
        if old {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The test binary's `main`.
pub fn main() -> ExitCode {
    let (args, filters) = split_filters(std::env::args().collect());
    let over = Overrides {
        write_traceability: std::env::var_os("DVMLAB_WRITE_TRACEABILITY").is_some(),
        filters,
        ..Overrides::default()
    };
    match run(&args, &over) {
        Ok((code, _)) => code,
        Err(e) => {
            eprintln!("conformance: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs the trials `args` select; returns the exit code and, if any trial ran, the results.
pub fn run(args: &Arguments, over: &Overrides) -> Result<(ExitCode, Option<Results>), String> {
    let suite = Arc::new(setup(over)?);
    let write_traceability = over.write_traceability;
    let mut trials = Vec::new();
    let mut registered: Vec<String> = suite
        .tests
        .values()
        .flat_map(|t| {
            std::iter::once(t.name.to_string())
                .chain(t.aspects.iter().map(move |a| format!("{}/{a}", t.name)))
        })
        .collect();
    registered.sort_unstable();
    trials.extend(meta_trials(&suite.catalogs, registered, write_traceability));
    for cell in suite.knobs.cells.clone() {
        for c in &suite.catalogs {
            for item in &c.items {
                let name = if suite.knobs.is_matrix() {
                    format!("{}/{}", cell.name(), item.id)
                } else {
                    item.id.clone()
                };
                let (s, spec, item) = (suite.clone(), c.spec.clone(), item.clone());
                trials.push(Trial::ignorable_test(name, move || {
                    s.run_item(&cell, &spec, &item)
                }));
            }
        }
    }
    if !over.filters.is_empty() {
        let picked = |name: &str| {
            over.filters.iter().any(|f| {
                if args.exact {
                    name == f
                } else {
                    name.contains(f.as_str())
                }
            })
        };
        trials.retain(|t| picked(t.name()));
    }
    let will_run = trials
        .iter()
        .filter(|t| !args.is_filtered_out(t) && !args.is_ignored(t))
        .count();
    if !args.list && will_run > 0 {
        eprintln!(
            "conformance: profile {} ({}), backend {:?}, cells {}, seed {}{}; results in {}",
            suite.profile.path.display(),
            suite.profile.implementation.name,
            suite.knobs.cells[0].backend,
            suite
                .knobs
                .cells
                .iter()
                .map(Cell::name)
                .collect::<Vec<_>>()
                .join(" "),
            suite.knobs.seed,
            if suite.knobs.seed_given {
                " (given)"
            } else {
                ""
            },
            suite.out.display()
        );
    }
    let conclusion = libtest_mimic::run(args, trials);
    let results = (!args.list && will_run > 0).then(|| finish(&suite, write_traceability));
    Ok((conclusion.exit_code(), results))
}

/// Writes the reports of this run (all its processes so far) and prints the totals line.
fn finish(suite: &Suite, write_traceability: bool) -> Results {
    let cells: Vec<String> = suite.knobs.cells.iter().map(Cell::name).collect();
    let results = report::assemble(
        &suite.catalogs,
        &cells,
        suite.collect_records(),
        ProfileInfo {
            path: suite.profile.path.display().to_string(),
            implementation: suite.profile.implementation.name.clone(),
        },
        &format!("{:?}", suite.knobs.cells[0].backend).to_lowercase(),
        suite.knobs.seed,
    );
    if let Err(e) = report::write_all(&suite.out, &results, &suite.catalogs) {
        eprintln!("conformance: writing reports: {e}");
    }
    if write_traceability {
        let first = &cells[0];
        let last: BTreeMap<String, String> = results
            .items
            .iter()
            .filter(|i| &i.cell == first)
            .map(|i| (i.id.clone(), i.outcome.label().to_string()))
            .collect();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(traceability::FILE);
        let text = traceability::render(&suite.catalogs, &last);
        match report::atomic_write(&path, &text) {
            Ok(()) => eprintln!("conformance: wrote {}", path.display()),
            Err(e) => eprintln!("conformance: {e}"),
        }
    }
    if results.items.iter().any(|i| i.outcome == Outcome::Fail) && !suite.knobs.seed_given {
        eprintln!(
            "conformance: replay with DVMLAB_SEED={} (the fault schedules are drawn from it)",
            suite.knobs.seed
        );
    }
    eprintln!(
        "conformance: reports {}/{{results.json,junit.xml,report.md}}",
        suite.out.display()
    );
    println!("{}", report::totals_line(&results));
    println!("{}", report::verdict_line(&results));
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn every_word_that_is_no_option_or_option_value_is_a_filter() {
        let (args, filters) = split_filters(words(
            "suite bootstrap.C1 --skip rfc33 --exact bootstrap.C2 --test-threads 1 --list",
        ));
        assert_eq!(filters, ["bootstrap.C1", "bootstrap.C2"]);
        assert_eq!(args.skip, ["rfc33"]);
        assert!(args.exact && args.list);
        assert_eq!(args.test_threads, Some(1));
        assert_eq!(args.filter, None);
    }
}
