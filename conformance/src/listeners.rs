//! PMIx event listeners and notifications of the implementation under test, through its
//! profile's `[events]` commands: what the RFC 0002 tests observe, as JSON lines.

use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use dvmlab_harness::wait_until;

use serde_json::Value;

use crate::outcome::{fail, OrUnresolved, Problem, Verdict};
use crate::profile::Events;
use crate::sut::Dvm;

/// A running listener (a tool, or a job of listeners) and where its lines go.
pub struct Listener {
    child: Child,
    out: PathBuf,
    what: String,
}

/// One line a listener printed: the job process it came from (`[PROC] `), and the JSON.
#[derive(Debug, Clone)]
pub struct Line {
    pub proc: Option<u32>,
    pub json: Value,
}

impl Line {
    /// A handler call (not a `ready` or `served` line).
    pub fn is_call(&self) -> bool {
        self.json.get("handler").is_some()
    }

    pub fn handler(&self) -> &str {
        self.json["handler"].as_str().unwrap_or("")
    }
}

fn parse_lines(text: &str) -> Vec<Line> {
    text.lines()
        .filter_map(|l| {
            let (proc, rest) = match l.strip_prefix('[').and_then(|r| r.split_once("] ")) {
                Some((p, rest)) => (p.parse().ok(), rest),
                None => (None, l),
            };
            serde_json::from_str(rest)
                .ok()
                .map(|json| Line { proc, json })
        })
        .collect()
}

fn events_profile(dvm: &Dvm) -> Result<Events, Problem> {
    dvm.profile().events.clone().ok_or_else(|| {
        Problem::Unsupported(
            "the profile has no [events] section (how to listen and notify)".into(),
        )
    })
}

impl Listener {
    /// The lines printed so far.
    pub fn lines(&self) -> Vec<Line> {
        parse_lines(&std::fs::read_to_string(&self.out).unwrap_or_default())
    }

    /// Waits until `n` listeners printed their `ready` line; those lines.
    pub fn wait_ready(&self, n: usize, within: Duration) -> Result<Vec<Line>, Problem> {
        wait_until(within, Duration::from_millis(20), || {
            let ready: Vec<Line> = self
                .lines()
                .into_iter()
                .filter(|l| l.json["ready"] == true)
                .collect();
            if ready.len() >= n {
                Ok(ready)
            } else {
                Err(format!(
                    "{} of {n} ready; output: {:?}",
                    ready.len(),
                    self.lines()
                ))
            }
        })
        .map_err(|e| fail(format!("{} ready within {within:?}", self.what), e))
    }

    /// Waits until the listener's lines satisfy `ok` (described by `what`); its lines then.
    pub fn wait_lines(
        &self,
        what: &str,
        within: Duration,
        ok: impl Fn(&[Line]) -> bool,
    ) -> Result<Vec<Line>, Problem> {
        wait_until(within, Duration::from_millis(20), || {
            let lines = self.lines();
            if ok(&lines) {
                Ok(lines)
            } else {
                Err(format!("output so far: {lines:?}"))
            }
        })
        .map_err(|e| fail(format!("{}: {what} within {within:?}", self.what), e))
    }

    /// Ends the listener now; every line it printed.
    pub fn stop(mut self) -> Vec<Line> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.lines()
    }

    /// Waits for the listener to end (its own timeout ends it); every line it printed.
    pub fn finish(mut self, within: Duration) -> Result<Vec<Line>, Problem> {
        let ended = wait_until(within, Duration::from_millis(20), || {
            match self.child.try_wait() {
                Ok(Some(_)) => Ok(Ok(())),
                Ok(None) => Err("still running".to_string()),
                Err(e) => Ok(Err(e.to_string())),
            }
        });
        match ended {
            Ok(Ok(())) => Ok(self.lines()),
            Ok(Err(e)) => Err(Problem::Unresolved(format!("waiting for a listener: {e}"))),
            Err(_) => {
                let _ = self.child.kill();
                Err(fail(
                    format!("{} ends within {within:?}", self.what),
                    format!("still running; output: {:?}", self.lines()),
                ))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Dvm<'_> {
    /// `words` with `{run_dir}` (a directory of this cluster's, the same for every command
    /// on every host) filled in.
    fn fill_run_dir(&self, words: &[String]) -> Vec<String> {
        let dir = self.cluster.run_dir().to_string_lossy().into_owned();
        words.iter().map(|w| w.replace("{run_dir}", &dir)).collect()
    }

    fn chain_file(&self, name: &str, chain: &Value) -> Result<String, Problem> {
        let path = self.cluster.run_dir().join(format!("{name}.chain.json"));
        std::fs::write(&path, chain.to_string()).or_unresolved("writing a chain file")?;
        Ok(path.to_string_lossy().into_owned())
    }

    fn spawn_listener(
        &self,
        host: &str,
        argv: Vec<String>,
        name: &str,
    ) -> Result<Listener, Problem> {
        let out = self.cluster.run_dir().join(format!("{name}.out"));
        let file = std::fs::File::create(&out).or_unresolved("a listener's output file")?;
        let child = self
            .cluster
            .command(host, &argv)
            .or_unresolved("the listen command")?
            .stdin(std::process::Stdio::null())
            .stdout(file)
            .stderr(std::process::Stdio::null())
            .spawn()
            .or_unresolved("starting the listen command")?;
        Ok(Listener {
            child,
            out,
            what: format!("listener {name} on {host}"),
        })
    }

    /// A tool on `host` listening with `chain` (the JSON chain file's content) until
    /// `secs` have passed.
    pub fn listen(
        &self,
        host: &str,
        name: &str,
        chain: &Value,
        secs: u32,
    ) -> Result<Listener, Problem> {
        let e = events_profile(self)?;
        let mut argv = self.fill_run_dir(&e.listen);
        argv.extend([
            "--chain".into(),
            self.chain_file(name, chain)?,
            "--timeout".into(),
            secs.to_string(),
        ]);
        self.spawn_listener(host, argv, name)
    }

    /// A job of `nprocs` listeners on `hosts`, each with `chain`, until `secs` have passed.
    pub fn listen_in_job(
        &self,
        hosts: &[String],
        nprocs: usize,
        name: &str,
        chain: &Value,
        secs: u32,
    ) -> Result<Listener, Problem> {
        let e = events_profile(self)?;
        let mut argv: Vec<String> = self
            .fill_run_dir(&e.listen_in_job)
            .iter()
            .map(|w| {
                w.replace("{nprocs}", &nprocs.to_string())
                    .replace("{hosts}", &hosts.join(","))
            })
            .collect();
        argv.extend([
            "--chain".into(),
            self.chain_file(name, chain)?,
            "--timeout".into(),
            secs.to_string(),
        ]);
        let ctl = self.ctl.clone();
        self.spawn_listener(&ctl, argv, name)
    }

    /// Notifies `code` with `range` (and targets, info) as a tool on `host`.
    pub fn notify(
        &self,
        host: &str,
        code: i32,
        range: &str,
        targets: &[String],
        info: &[(&str, &str)],
    ) -> Verdict {
        let e = events_profile(self)?;
        let mut argv = self.fill_run_dir(&e.notify);
        argv.extend([code.to_string(), "--range".into(), range.into()]);
        for t in targets {
            argv.extend(["--target".into(), t.clone()]);
        }
        for (k, v) in info {
            argv.extend(["--info".into(), format!("{k}={v}")]);
        }
        let (code, out, err) = self.run_on(host, &argv, Duration::from_secs(20))?;
        if code == Some(0) {
            Ok(())
        } else {
            Err(fail(
                "the notify command succeeds",
                format!("exit {code:?}: {out}{err}"),
            ))
        }
    }
}

impl<'a> Dvm<'a> {
    /// The profile's events server (`[events] server`) on one host, `n01`, serving.
    pub fn events_server(ctx: &'a crate::sut::Ctx, label: &str) -> Result<Dvm<'a>, Problem> {
        let server = ctx
            .profile
            .events
            .as_ref()
            .and_then(|e| e.server.clone())
            .ok_or_else(|| Problem::Unsupported("the profile has no [events] server".into()))?;
        let hosts = vec!["n01".to_string()];
        let mut dvm = Dvm::build(
            ctx,
            label,
            &hosts,
            &dvmlab_harness::PrteConf::new(),
            server,
            |_| {},
        )?;
        let argv = dvm.fill_run_dir(dvm.cluster.daemon());
        dvm.cluster.set_daemon(argv);
        dvm.start_all()?;
        let log = dvm.cluster.log_file("n01");
        wait_until(Duration::from_secs(20), Duration::from_millis(20), || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if parse_lines(&text).iter().any(|l| l.json["ready"] == true) {
                Ok(())
            } else {
                Err(format!("its output so far: {text:?}"))
            }
        })
        .map_err(|e| fail("the events server prints {\"ready\": true} within 20 s", e))?;
        Ok(dvm)
    }
}
