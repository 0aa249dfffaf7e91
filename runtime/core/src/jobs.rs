//! The controller's job manager: takes jobs from tools, places them on daemon ranks, hands
//! them to the job-exec module, follows their states from its events, streams their output
//! back to the submitting tool, enforces time limits, and keeps the list of live jobs the
//! shell persists so a restarted controller can recover them.
//!
//! Sans-IO: the shell feeds [`Input`]s and carries out [`Output`]s.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::exec::{self, JobEvent, JobId, JobSpec};
use crate::overlay::LinkId;
use crate::roster::Roster;
use crate::tree::Rank;
use dvmlab_proto::idset::IdSet;
use dvmlab_proto::limits::{
    JOB_HISTORY, MAX_JOB_SPEC_BYTES, MAX_LIVE_JOBS, MAX_PROCS_PER_JOB, MAX_PROCS_PER_NODE,
};
use dvmlab_proto::placement::Placement;
use dvmlab_proto::wire::{JobSummary, Submit, ToolReply};

#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Place and start a job on the roster's compute ranks.
    Submit {
        link: LinkId,
        job: Submit,
    },
    Jobs {
        link: LinkId,
    },
    Kill {
        link: LinkId,
        id: JobId,
        signal: i32,
    },
    /// Stdin for process 0 of a job, from the tool that submitted it.
    Stdin {
        link: LinkId,
        id: JobId,
        data: Vec<u8>,
        eof: bool,
    },
    /// A tool's connection closed: its jobs keep running, their output is dropped.
    ToolGone {
        link: LinkId,
    },
    Event(JobEvent),
    TimeLimit(JobId),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Exec(exec::Input),
    Reply {
        link: LinkId,
        reply: ToolReply,
    },
    /// Call back with `TimeLimit(id)` after `delay`.
    SetTimer {
        id: JobId,
        delay: Duration,
    },
    /// The live jobs, to be written where a restarted controller finds them.
    Persist(Vec<Persisted>),
    /// Job `id` ended (every rank released) with this greatest wait status.
    Ended {
        id: JobId,
        status: i32,
        exception: Option<String>,
    },
}

/// A live job as persisted across controller restarts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Persisted {
    pub id: JobId,
    pub userid: u32,
    pub ranks: IdSet,
    pub spec: JobSpec,
    pub report: JobSummary,
    pub time_limit_ms: Option<u64>,
}

#[derive(Debug, Clone)]
struct Job {
    userid: u32,
    ranks: IdSet,
    spec: JobSpec,
    report: JobSummary,
    tool: Option<LinkId>,
    time_limit_ms: Option<u64>,
}

/// See the module documentation.
#[derive(Debug)]
pub struct JobManager {
    next_id: JobId,
    jobs: BTreeMap<JobId, Job>,
    out: Vec<Output>,
}

/// The bytes a job's description takes: what [`MAX_JOB_SPEC_BYTES`] bounds.
fn spec_bytes(job: &Submit) -> usize {
    let strings = job.argv.iter().chain(job.hosts.iter().flatten());
    let env = job.env.iter().map(|(k, v)| k.len() + v.len() + 2);
    strings.map(|a| a.len() + 1).sum::<usize>()
        + env.sum::<usize>()
        + job.cwd.as_ref().map_or(0, String::len)
}

impl JobManager {
    /// A job manager recovering `live` (read
    /// back after a restart; empty on a fresh start). The first output tells job-exec which
    /// jobs run, so its hello can begin.
    pub fn new(live: Vec<Persisted>) -> (JobManager, Vec<Output>) {
        let next_id = live.iter().map(|p| p.id + 1).max().unwrap_or(1);
        let mut m = JobManager {
            next_id,
            jobs: BTreeMap::new(),
            out: Vec::new(),
        };
        let mut recovered = Vec::new();
        for p in live {
            recovered.push((p.id, p.userid, p.ranks.clone(), p.spec.clone()));
            m.jobs.insert(
                p.id,
                Job {
                    userid: p.userid,
                    ranks: p.ranks,
                    spec: p.spec,
                    report: p.report,
                    tool: None,
                    time_limit_ms: p.time_limit_ms,
                },
            );
        }
        m.emit(Output::Exec(exec::Input::Recovered(recovered)));
        let out = std::mem::take(&mut m.out);
        (m, out)
    }

    /// Feeds one input; `roster` is the DVM's membership as the controller sees it now.
    pub fn handle(&mut self, roster: &Roster, input: Input) -> Vec<Output> {
        match input {
            Input::Submit { link, job } => self.submit(roster, link, job),
            Input::Jobs { link } => {
                let jobs: Vec<JobSummary> = self.jobs.values().map(|j| j.report.clone()).collect();
                for j in jobs {
                    self.reply(link, ToolReply::Job(j));
                }
                self.reply(link, ToolReply::JobsEnd);
            }
            Input::Kill { link, id, signal } => self.kill(link, id, signal),
            Input::Stdin {
                link,
                id,
                data,
                eof,
            } => self.stdin(link, id, data, eof),
            Input::ToolGone { link } => {
                for j in self.jobs.values_mut() {
                    if j.tool == Some(link) {
                        j.tool = None;
                    }
                }
            }
            Input::Event(e) => self.on_event(e),
            Input::TimeLimit(id) => {
                let live = self
                    .jobs
                    .get(&id)
                    .is_some_and(|j| matches!(j.report.state.as_str(), "STARTING" | "RUNNING"));
                if live {
                    let ms = self
                        .jobs
                        .get(&id)
                        .and_then(|j| j.time_limit_ms)
                        .unwrap_or(0);
                    self.emit(Output::Exec(exec::Input::Raise {
                        id,
                        severity: 0,
                        kind: "timeout".into(),
                        note: format!("time limit of {ms} ms reached"),
                    }));
                }
            }
        }
        std::mem::take(&mut self.out)
    }

    fn emit(&mut self, o: Output) {
        self.out.push(o);
    }

    fn reply(&mut self, link: LinkId, reply: ToolReply) {
        self.emit(Output::Reply { link, reply });
    }

    fn error(&mut self, link: LinkId, message: String) {
        self.reply(link, ToolReply::Error { message });
    }

    fn submit(&mut self, roster: &Roster, link: LinkId, job: Submit) {
        let joined = roster.compute_ranks();
        if job.argv.is_empty() {
            return self.error(link, "a job needs a command".into());
        }
        if job.nprocs == Some(0) {
            return self.error(link, "a job needs at least one process (-n)".into());
        }
        if let Some(n) = job.nprocs.filter(|n| *n > MAX_PROCS_PER_JOB) {
            return self.error(
                link,
                format!("-n {n}: a job may have at most {MAX_PROCS_PER_JOB} processes"),
            );
        }
        let bytes = spec_bytes(&job);
        if bytes > MAX_JOB_SPEC_BYTES {
            return self.error(
                link,
                format!("the job's command, environment, directory and hosts take {bytes} bytes; at most {MAX_JOB_SPEC_BYTES} are accepted"),
            );
        }
        let live = self
            .jobs
            .values()
            .filter(|j| j.report.state != "INACTIVE")
            .count();
        if live >= MAX_LIVE_JOBS {
            return self.error(
                link,
                format!("{live} jobs are running, the most the DVM runs at once; try again when one ends"),
            );
        }
        let nodes: Vec<Rank> = match &job.hosts {
            Some(hosts) => {
                let mut v = Vec::new();
                for h in hosts {
                    match roster.rank_of(h) {
                        Some(r) if joined.contains(&r) => v.push(r),
                        Some(_) => {
                            return self.error(link, format!("host {h} has no joined daemon"))
                        }
                        None => return self.error(link, format!("host {h} is not in the DVM")),
                    }
                }
                v
            }
            None => joined,
        };
        if nodes.is_empty() {
            return self.error(link, "no joined daemon to run the job on".into());
        }
        // One process per node unless told otherwise.
        let nprocs = job.nprocs.unwrap_or(nodes.len() as u32);
        let placement = Placement::new(nprocs, nodes, job.map_by);
        let counts = placement.counts();
        if let Some((rank, n)) = counts.iter().find(|(_, n)| **n > MAX_PROCS_PER_NODE) {
            let host = roster.host(*rank);
            return self.error(
                link,
                format!("-n {nprocs}: {n} processes would run on {host} (rank {rank}); at most {MAX_PROCS_PER_NODE} of one job run on one node"),
            );
        }
        let ranks: IdSet = counts.keys().copied().collect();
        let id = self.next_id;
        self.next_id += 1;
        let spec = JobSpec {
            argv: job.argv.clone(),
            env: job.env.clone(),
            cwd: job.cwd.clone(),
            placement: placement.clone(),
            stdin: job.stdin,
        };
        let report = JobSummary {
            id,
            state: "STARTING".into(),
            argv: job.argv,
            placement: placement.clone(),
            status: None,
            exception: None,
        };
        self.jobs.insert(
            id,
            Job {
                userid: job.userid,
                ranks: ranks.clone(),
                spec: spec.clone(),
                report,
                tool: Some(link),
                time_limit_ms: job.time_limit_ms,
            },
        );
        self.prune_history();
        self.persist();
        self.reply(link, ToolReply::Submitted { id, placement });
        self.emit(Output::Exec(exec::Input::Submit {
            id,
            userid: job.userid,
            ranks,
            spec,
        }));
    }

    fn kill(&mut self, link: LinkId, id: JobId, signal: i32) {
        if !self.jobs.contains_key(&id) {
            return self.error(link, format!("no job {id}"));
        }
        // SIGKILL is the job's end: a fatal exception, as the RFC has it for cancellation.
        self.emit(Output::Exec(if signal == 9 {
            exec::Input::Raise {
                id,
                severity: 0,
                kind: "cancel".into(),
                note: "killed by a tool".into(),
            }
        } else {
            exec::Input::Signal { id, signal }
        }));
        self.reply(link, ToolReply::Signalled { id });
    }

    /// Only the submitting connection feeds a job's stdin, and only while the job runs:
    /// another tool cannot write into someone's job.
    fn stdin(&mut self, link: LinkId, id: JobId, data: Vec<u8>, eof: bool) {
        let Some(j) = self.jobs.get(&id) else {
            return self.error(link, format!("no job {id}"));
        };
        if j.tool != Some(link) {
            return self.error(
                link,
                format!("job {id} was not submitted on this connection: only its submitter feeds its stdin"),
            );
        }
        if !j.spec.stdin {
            return self.error(link, format!("job {id} was submitted without stdin"));
        }
        if j.report.state == "INACTIVE" {
            return;
        }
        self.emit(Output::Exec(exec::Input::Stdin { id, data, eof }));
    }

    fn on_event(&mut self, e: JobEvent) {
        match e {
            JobEvent::Started { id } => {
                let limit = self.jobs.get_mut(&id).and_then(|j| {
                    j.report.state = "RUNNING".into();
                    j.time_limit_ms
                });
                if let Some(ms) = limit {
                    self.emit(Output::SetTimer {
                        id,
                        delay: Duration::from_millis(ms),
                    });
                }
                self.persist();
            }
            JobEvent::Finished { id, status } => {
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.report.state = "CLEANUP".into();
                    j.report.status = Some(status);
                }
                self.persist();
            }
            JobEvent::Exception { id, kind, note, .. } => {
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.report.exception.get_or_insert(format!("{kind}: {note}"));
                }
            }
            JobEvent::Released { id, last, .. } => {
                if !last {
                    return;
                }
                let Some(j) = self.jobs.get_mut(&id) else {
                    return;
                };
                j.report.state = "INACTIVE".into();
                let (tool, status, exception) = (
                    j.tool.take(),
                    j.report.status.unwrap_or(0),
                    j.report.exception.clone(),
                );
                if let Some(link) = tool {
                    self.reply(
                        link,
                        ToolReply::JobEnded {
                            id,
                            status,
                            exception: exception.clone(),
                        },
                    );
                }
                self.emit(Output::Ended {
                    id,
                    status,
                    exception,
                });
                self.persist();
            }
            JobEvent::StdinAck { id, bytes } => {
                if let Some(link) = self.jobs.get(&id).and_then(|j| j.tool) {
                    self.reply(link, ToolReply::StdinAck { id, bytes });
                }
            }
            JobEvent::Output {
                id,
                proc,
                stream,
                data,
            } => {
                if let Some(link) = self.jobs.get(&id).and_then(|j| j.tool) {
                    self.reply(
                        link,
                        ToolReply::JobOutput {
                            id,
                            proc,
                            stream,
                            data,
                        },
                    );
                }
            }
        }
    }

    fn prune_history(&mut self) {
        while self.jobs.len() > JOB_HISTORY {
            let Some(old) = self
                .jobs
                .iter()
                .find(|(_, j)| j.report.state == "INACTIVE")
                .map(|(id, _)| *id)
            else {
                break;
            };
            self.jobs.remove(&old);
        }
    }

    fn persist(&mut self) {
        let live = self
            .jobs
            .iter()
            .filter(|(_, j)| j.report.state != "INACTIVE")
            .map(|(id, j)| Persisted {
                id: *id,
                userid: j.userid,
                ranks: j.ranks.clone(),
                spec: j.spec.clone(),
                report: j.report.clone(),
                time_limit_ms: j.time_limit_ms,
            })
            .collect();
        self.emit(Output::Persist(live));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roster::State;
    use dvmlab_proto::placement::MapBy;
    use dvmlab_proto::wire::Stream;

    fn submit(n: u32, map_by: MapBy, hosts: Option<Vec<String>>) -> Submit {
        Submit {
            argv: vec!["hostname".into()],
            env: vec![],
            cwd: None,
            nprocs: Some(n),
            map_by,
            hosts,
            time_limit_ms: Some(500),
            userid: 1000,
            stdin: false,
        }
    }

    fn mgr() -> JobManager {
        JobManager::new(vec![]).0
    }

    /// ctl, n01, n02, n03 with `wired` wired in (and the controller, not a compute node).
    fn wired(wired: &[Rank]) -> Roster {
        let hosts = ["ctl", "n01", "n02", "n03"].map(String::from).to_vec();
        let mut r = Roster::from_conf(&hosts, false, 0);
        for w in wired {
            r.set(*w, State::Wired);
        }
        r
    }

    #[test]
    fn jobs_past_a_limit_are_refused_and_the_manager_runs_on() {
        let mut m = mgr();
        for (job, why) in [
            (
                submit(2_000_000, MapBy::Node, None),
                "at most 1048576 processes",
            ),
            (
                submit(MAX_PROCS_PER_NODE * 3 + 1, MapBy::Node, None),
                "processes would run on n01 (rank 1)",
            ),
            (
                Submit {
                    argv: vec!["x".repeat(MAX_JOB_SPEC_BYTES)],
                    ..submit(1, MapBy::Node, None)
                },
                "at most 65536 are accepted",
            ),
        ] {
            let out = m.handle(&wired(&[1, 2, 3]), Input::Submit { link: 1, job });
            assert!(
                matches!(&out[..], [Output::Reply { reply: ToolReply::Error { message }, .. }] if message.contains(why)),
                "{why}: {out:?}"
            );
        }
        for _ in 0..MAX_LIVE_JOBS {
            m.handle(
                &wired(&[1]),
                Input::Submit {
                    link: 1,
                    job: submit(1, MapBy::Node, None),
                },
            );
        }
        let out = m.handle(
            &wired(&[1]),
            Input::Submit {
                link: 1,
                job: submit(1, MapBy::Node, None),
            },
        );
        assert!(
            matches!(&out[..], [Output::Reply { reply: ToolReply::Error { message }, .. }] if message.contains("the most the DVM runs at once")),
            "{out:?}"
        );
    }

    #[test]
    fn only_the_submitting_connection_feeds_a_jobs_stdin_and_hears_its_acknowledgements() {
        let mut m = mgr();
        let job = Submit {
            stdin: true,
            ..submit(2, MapBy::Node, None)
        };
        m.handle(&wired(&[1, 2]), Input::Submit { link: 5, job });
        let stdin = |link| Input::Stdin {
            link,
            id: 1,
            data: b"abc".to_vec(),
            eof: false,
        };
        let out = m.handle(&wired(&[1, 2]), stdin(6));
        assert!(
            matches!(&out[..], [Output::Reply { link: 6, reply: ToolReply::Error { message } }] if message.contains("only its submitter")),
            "{out:?}"
        );
        let out = m.handle(&wired(&[1, 2]), stdin(5));
        assert_eq!(
            out,
            vec![Output::Exec(exec::Input::Stdin {
                id: 1,
                data: b"abc".to_vec(),
                eof: false
            })]
        );
        let out = m.handle(
            &wired(&[1, 2]),
            Input::Event(JobEvent::StdinAck { id: 1, bytes: 3 }),
        );
        assert_eq!(
            out,
            vec![Output::Reply {
                link: 5,
                reply: ToolReply::StdinAck { id: 1, bytes: 3 }
            }]
        );
        m.handle(
            &wired(&[1, 2]),
            Input::Submit {
                link: 5,
                job: submit(1, MapBy::Node, None),
            },
        );
        let out = m.handle(
            &wired(&[1, 2]),
            Input::Stdin {
                link: 5,
                id: 2,
                data: vec![],
                eof: true,
            },
        );
        assert!(
            matches!(&out[..], [Output::Reply { reply: ToolReply::Error { message }, .. }] if message.contains("without stdin")),
            "{out:?}"
        );
    }

    #[test]
    fn a_job_goes_through_its_states_and_its_tool_hears_output_and_the_end() {
        let mut m = mgr();
        let out = m.handle(
            &wired(&[1, 2, 3]),
            Input::Submit {
                link: 5,
                job: submit(3, MapBy::Node, None),
            },
        );
        assert!(out.iter().any(|o| matches!(
            o,
            Output::Reply {
                link: 5,
                reply: ToolReply::Submitted { id: 1, .. }
            }
        )));
        assert!(out
            .iter()
            .any(|o| matches!(o, Output::Exec(exec::Input::Submit { id: 1, .. }))));
        let out = m.handle(&wired(&[]), Input::Event(JobEvent::Started { id: 1 }));
        assert!(out.contains(&Output::SetTimer {
            id: 1,
            delay: Duration::from_millis(500)
        }));
        let out = m.handle(
            &wired(&[]),
            Input::Event(JobEvent::Output {
                id: 1,
                proc: 2,
                stream: Stream::Stdout,
                data: b"n03\n".to_vec(),
            }),
        );
        assert!(matches!(
            &out[0],
            Output::Reply {
                link: 5,
                reply: ToolReply::JobOutput { proc: 2, .. }
            }
        ));
        m.handle(
            &wired(&[]),
            Input::Event(JobEvent::Finished { id: 1, status: 256 }),
        );
        let out = m.handle(
            &wired(&[]),
            Input::Event(JobEvent::Released {
                id: 1,
                ranks: IdSet::range(1, 3),
                last: true,
            }),
        );
        assert!(out.contains(&Output::Reply {
            link: 5,
            reply: ToolReply::JobEnded {
                id: 1,
                status: 256,
                exception: None
            }
        }));
        assert!(
            out.contains(&Output::Persist(vec![])),
            "an ended job is no longer live"
        );
        let out = m.handle(&wired(&[]), Input::Jobs { link: 6 });
        assert!(
            matches!(&out[0], Output::Reply { reply: ToolReply::Job(j), .. } if j.state == "INACTIVE")
        );
        assert_eq!(
            out[1],
            Output::Reply {
                link: 6,
                reply: ToolReply::JobsEnd
            }
        );
    }

    #[test]
    fn bad_submissions_are_refused_with_a_reason() {
        let mut m = mgr();
        for (job, joined, why) in [
            (
                submit(0, MapBy::Node, None),
                vec![1],
                "at least one process",
            ),
            (
                submit(1, MapBy::Node, Some(vec!["zz".into()])),
                vec![1],
                "zz is not in the DVM",
            ),
            (
                submit(1, MapBy::Node, Some(vec!["n02".into()])),
                vec![1],
                "n02 has no joined daemon",
            ),
            (submit(1, MapBy::Node, None), vec![], "no joined daemon"),
        ] {
            let out = m.handle(&wired(&joined), Input::Submit { link: 1, job });
            assert!(
                matches!(&out[..], [Output::Reply { reply: ToolReply::Error { message }, .. }] if message.contains(why)),
                "{why}: {out:?}"
            );
        }
    }

    #[test]
    fn a_time_limit_raises_a_fatal_timeout_exception_only_while_the_job_runs() {
        let mut m = mgr();
        m.handle(
            &wired(&[1]),
            Input::Submit {
                link: 5,
                job: submit(1, MapBy::Node, None),
            },
        );
        m.handle(&wired(&[]), Input::Event(JobEvent::Started { id: 1 }));
        let out = m.handle(&wired(&[]), Input::TimeLimit(1));
        assert!(
            matches!(&out[0], Output::Exec(exec::Input::Raise { severity: 0, kind, .. }) if kind == "timeout")
        );
        m.handle(
            &wired(&[]),
            Input::Event(JobEvent::Finished { id: 1, status: 9 }),
        );
        assert!(m.handle(&wired(&[]), Input::TimeLimit(1)).is_empty());
    }

    #[test]
    fn a_restarted_manager_recovers_live_jobs_and_numbers_on() {
        let mut m = mgr();
        let out = m.handle(
            &wired(&[1, 2]),
            Input::Submit {
                link: 5,
                job: submit(2, MapBy::Node, None),
            },
        );
        let Some(Output::Persist(live)) = out
            .iter()
            .find(|o| matches!(o, Output::Persist(_)))
            .cloned()
        else {
            panic!("no persist: {out:?}");
        };
        let (mut m2, first) = JobManager::new(live);
        assert!(matches!(&first[0], Output::Exec(exec::Input::Recovered(list)) if list.len() == 1));
        let out = m2.handle(
            &wired(&[1]),
            Input::Submit {
                link: 7,
                job: submit(1, MapBy::Node, None),
            },
        );
        assert!(out.iter().any(|o| matches!(
            o,
            Output::Reply {
                reply: ToolReply::Submitted { id: 2, .. },
                ..
            }
        )));
    }
}
