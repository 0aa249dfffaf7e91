//! Wires a daemon's job-exec module to its links, its job shells and (on the controller) the
//! job manager, whose list of live jobs is kept in the session directory so a restarted
//! controller recovers them.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

use tracing::{debug, warn};

use super::jobs::Runner;
use crate::jobexec::{self, Counters, JobExec, JobId};
use crate::jobmgr::{self, JobManager, Persisted};
use crate::node::LinkId;
use crate::tree::Rank;
use crate::wire::{DaemonMsg, Frame, ToolReply, ToolRequest};

/// What the shell must do for the job side.
pub enum Effect {
    Send(LinkId, Frame),
    /// Call [`JobCtl::time_limit`] for this job after the delay.
    Timer(JobId, Duration),
}

enum Work {
    Exec(jobexec::Input),
    Mgr(jobmgr::Input),
}

/// See the module documentation.
pub struct JobCtl {
    exec: JobExec,
    mgr: Option<JobManager>,
    runner: Runner,
    up: Option<LinkId>,
    /// Keeps the controller's live jobs on disk.
    jobs_file: Option<JobsFile>,
}

/// Writes the controller's list of live jobs to its file, off the daemon's thread: replacing
/// a file by rename costs about a millisecond on ext4 (it flushes the new data first), which
/// every job would otherwise wait for several times. Only the latest list is written when
/// several are queued; dropping the value writes what is queued before it returns, so a
/// controller that stops leaves its last list behind. A controller killed within that
/// millisecond of a submit loses the job; its daemons then end it as unknown, as they do for
/// any job the controller forgot.
struct JobsFile {
    latest: Option<std::sync::mpsc::Sender<Vec<Persisted>>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl JobsFile {
    fn start(path: PathBuf) -> JobsFile {
        let (latest, rx) = std::sync::mpsc::channel::<Vec<Persisted>>();
        let writer = std::thread::spawn(move || {
            while let Ok(mut live) = rx.recv() {
                while let Ok(newer) = rx.try_recv() {
                    live = newer;
                }
                let tmp = path.with_extension("tmp");
                let res = serde_json::to_vec(&live)
                    .map_err(std::io::Error::other)
                    .and_then(|b| std::fs::write(&tmp, b))
                    .and_then(|()| std::fs::rename(&tmp, &path));
                if let Err(e) = res {
                    warn!("cannot keep the job list in {}: {e}", path.display());
                }
            }
        });
        JobsFile {
            latest: Some(latest),
            writer: Some(writer),
        }
    }

    fn write(&self, live: Vec<Persisted>) {
        if let Some(tx) = &self.latest {
            // Fails only once the writer is gone, which happens only in drop.
            let _ = tx.send(live);
        }
    }
}

impl Drop for JobsFile {
    fn drop(&mut self) {
        // Closing the channel ends the writer after its last write.
        self.latest = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl JobCtl {
    /// `jobs_file` is given on the controller only; jobs found there are recovered.
    pub fn new(
        me: Rank,
        hosts: Vec<String>,
        runner: Runner,
        jobs_file: Option<PathBuf>,
    ) -> (JobCtl, Vec<Effect>) {
        let controller = jobs_file.is_some();
        let mut c = JobCtl {
            exec: JobExec::new(me, controller),
            mgr: None,
            runner,
            up: None,
            jobs_file: None,
        };
        let mut effects = Vec::new();
        if let Some(path) = jobs_file {
            let live: Vec<Persisted> = match std::fs::read_to_string(&path) {
                Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                    warn!(
                        "{}: not a job list ({e}); starting with none",
                        path.display()
                    );
                    Vec::new()
                }),
                Err(_) => Vec::new(),
            };
            if !live.is_empty() {
                warn!("recovering {} running job(s) after a restart", live.len());
            }
            c.jobs_file = Some(JobsFile::start(path));
            let (m, first) = JobManager::new(hosts, live);
            c.mgr = Some(m);
            let mut work = VecDeque::new();
            for o in first {
                c.mgr_output(o, &mut work, &mut effects);
            }
            effects.extend(c.run(work));
        }
        (c, effects)
    }

    /// Upward job-exec messages this daemon received, by kind.
    pub fn counters(&self) -> Counters {
        self.exec.counters.clone()
    }

    /// An input for job-exec (from the node core or a job shell).
    pub fn exec(&mut self, input: jobexec::Input) -> Vec<Effect> {
        if let jobexec::Input::Uplink(up) = &input {
            self.up = *up;
        }
        self.run(VecDeque::from([Work::Exec(input)]))
    }

    /// A job request from a tool; `joined` are the ranks that may run jobs.
    pub fn tool(&mut self, link: LinkId, req: ToolRequest, joined: Vec<Rank>) -> Vec<Effect> {
        let input = match req {
            ToolRequest::Submit { job } => jobmgr::Input::Submit { link, job, joined },
            ToolRequest::Jobs => jobmgr::Input::Jobs { link },
            ToolRequest::Kill { id, signal } => jobmgr::Input::Kill { link, id, signal },
            other => {
                debug!("not a job request: {other:?}");
                return Vec::new();
            }
        };
        if self.mgr.is_none() {
            let reply = ToolReply::Error {
                message: "jobs are submitted to the controller".into(),
            };
            return vec![Effect::Send(link, Frame::ToolReply(reply))];
        }
        self.run(VecDeque::from([Work::Mgr(input)]))
    }

    pub fn tool_gone(&mut self, link: LinkId) -> Vec<Effect> {
        if self.mgr.is_none() {
            return Vec::new();
        }
        self.run(VecDeque::from([Work::Mgr(jobmgr::Input::ToolGone {
            link,
        })]))
    }

    pub fn time_limit(&mut self, id: JobId) -> Vec<Effect> {
        self.run(VecDeque::from([Work::Mgr(jobmgr::Input::TimeLimit(id))]))
    }

    /// The daemon is exiting: no job process may outlive it.
    pub fn kill_all(&self) {
        self.runner.kill_all();
    }

    fn run(&mut self, mut work: VecDeque<Work>) -> Vec<Effect> {
        let mut effects = Vec::new();
        while let Some(w) = work.pop_front() {
            match w {
                Work::Exec(i) => {
                    for o in self.exec.handle(i) {
                        self.exec_output(o, &mut work, &mut effects);
                    }
                }
                Work::Mgr(i) => {
                    let Some(m) = self.mgr.as_mut() else { continue };
                    for o in m.handle(i) {
                        self.mgr_output(o, &mut work, &mut effects);
                    }
                }
            }
        }
        effects
    }

    fn mgr_output(
        &mut self,
        o: jobmgr::Output,
        work: &mut VecDeque<Work>,
        effects: &mut Vec<Effect>,
    ) {
        match o {
            jobmgr::Output::Exec(i) => work.push_back(Work::Exec(i)),
            jobmgr::Output::Reply { link, reply } => {
                effects.push(Effect::Send(link, Frame::ToolReply(reply)))
            }
            jobmgr::Output::SetTimer { id, delay } => effects.push(Effect::Timer(id, delay)),
            jobmgr::Output::Persist(live) => self.persist(live),
        }
    }

    fn exec_output(
        &mut self,
        o: jobexec::Output,
        work: &mut VecDeque<Work>,
        effects: &mut Vec<Effect>,
    ) {
        match o {
            jobexec::Output::SendDown { link, msg } => effects.push(Effect::Send(
                link,
                Frame::Daemon(DaemonMsg::ExecDown { msg }),
            )),
            jobexec::Output::SendUp(req) => match self.up {
                Some(up) => {
                    effects.push(Effect::Send(up, Frame::Daemon(DaemonMsg::ExecUp { req })))
                }
                // The module resends what matters after its next hello.
                None => debug!("no upward link for {req:?}; held until reconnected"),
            },
            jobexec::Output::Launch { id, spec } => self.runner.launch(id, spec),
            jobexec::Output::Kill { id, signal } => self.runner.kill(id, signal),
            jobexec::Output::BarrierDone { id, seq } => self.runner.barrier_done(id, seq),
            jobexec::Output::Epilog { id } => self.runner.epilog(id),
            jobexec::Output::Event(e) => work.push_back(Work::Mgr(jobmgr::Input::Event(e))),
            jobexec::Output::Log(l) => warn!("{l}"),
        }
    }

    fn persist(&self, live: Vec<Persisted>) {
        if let Some(f) = &self.jobs_file {
            f.write(live);
        }
    }
}
