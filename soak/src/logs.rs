//! Reading the hosts' logs into the history: each job process start with its node and
//! rank (`odls_base_verbose`), each daemon's start, join, departure and exit
//! (`PRTEDLogProcState`), at the times the daemons logged them.

use crate::history::{DaemonWhat, Entry};

/// Microseconds since the Unix epoch of an RFC 3339 UTC time as the daemons log it
/// (`2026-11-25T10:11:12.123456Z`).
pub fn parse_time(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.splitn(3, ':').map(|x| x.parse::<u64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let micros: u64 = format!("{frac:0<6}").get(..6)?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    Some(((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1_000_000) + micros)
}

/// The number after `key` in `line` (`rank 5` → 5).
fn number_after(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// The history records in `log`, the log of `host`.
pub fn records(host: &str, log: &str) -> Vec<(u64, Entry)> {
    let mut out = Vec::new();
    let mut rank: Option<u32> = None;
    for line in log.lines() {
        let Some((stamp, msg)) = line.split_once(' ') else {
            continue;
        };
        let Some(t) = parse_time(stamp) else { continue };
        let msg = msg.trim_start();
        let msg = msg
            .split_once(' ')
            .map(|(_, m)| m.trim_start())
            .unwrap_or(msg);
        let daemon = |what, rank: u32| Entry::Daemon {
            host: host.to_string(),
            rank,
            what,
        };
        if msg.starts_with("prted ") && msg.contains(" listening at ") {
            rank = number_after(msg, " rank ").map(|r| r as u32);
            if let Some(r) = rank {
                out.push((t, daemon(DaemonWhat::Started, r)));
            }
        } else if msg.starts_with("joined the DVM through") {
            if let Some(r) = rank {
                out.push((t, daemon(DaemonWhat::Joined, r)));
            }
        } else if msg.starts_with("daemon rank ") && msg.ends_with("state DEPARTING") {
            if let Some(r) = number_after(msg, "daemon rank ") {
                out.push((t, daemon(DaemonWhat::Departing, r as u32)));
            }
        } else if msg.starts_with("rank ") && msg.ends_with(" exited") {
            if let Some(r) = number_after(msg, "rank ") {
                out.push((t, daemon(DaemonWhat::Exited, r as u32)));
            }
        } else if msg.starts_with("job ") && msg.contains(" started on rank ") {
            if let (Some(job), Some(proc), Some(r), Some(pid)) = (
                number_after(msg, "job "),
                number_after(msg, " process "),
                number_after(msg, " started on rank "),
                number_after(msg, "(pid "),
            ) {
                out.push((
                    t,
                    Entry::ProcStart {
                        host: host.to_string(),
                        rank: r as u32,
                        job,
                        proc: proc as u32,
                        pid: pid as i64,
                    },
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_times_are_read_as_unix_microseconds() {
        assert_eq!(parse_time("1970-01-01T00:00:01.000002Z"), Some(1_000_002));
        assert_eq!(
            parse_time("2026-11-25T10:11:12.123456Z"),
            Some(1_795_601_472_123_456)
        );
        assert_eq!(
            parse_time("2000-02-29T00:00:00Z"),
            Some(951_782_400_000_000)
        );
        assert_eq!(parse_time("yesterday"), None);
    }

    #[test]
    fn starts_joins_departures_and_process_starts_are_read_from_a_log() {
        let log = "\
2026-11-25T10:00:00.000001Z  INFO prted dvm rank 3 (Daemon) on n03 listening at 10.200.0.4:1, session /tmp/x
2026-11-25T10:00:00.000002Z  INFO joined the DVM through parent rank 1
2026-11-25T10:00:00.000003Z  INFO job 7 process 2 started on rank 3 (pid 4242)
2026-11-25T10:00:00.000004Z  INFO daemon rank 3 state DEPARTING
2026-11-25T10:00:00.000005Z  INFO rank 3 exited
";
        let r = records("n03", log);
        assert_eq!(r.len(), 5, "{r:?}");
        assert_eq!(
            r[2].1,
            Entry::ProcStart {
                host: "n03".into(),
                rank: 3,
                job: 7,
                proc: 2,
                pid: 4242
            }
        );
        assert!(matches!(
            r[3].1,
            Entry::Daemon {
                what: DaemonWhat::Departing,
                rank: 3,
                ..
            }
        ));
    }
}
