//! The launch service on loopback: `plaunch serve` starts its one program for holders of
//! the DVM key and nothing for anyone else; `plaunch run` says how each launch went in its
//! exit status. (The elastic DVM growing through it is in `elastic.rs`.)

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PLAUNCH: &str = env!("CARGO_BIN_EXE_plaunch");
const PCTL: &str = env!("CARGO_BIN_EXE_pctl");

/// A directory with a prte.conf whose DVMKeyFile is a fresh key of its own.
struct Site {
    dir: PathBuf,
}

impl Site {
    fn new(test: &str) -> Site {
        let dir =
            std::env::temp_dir().join(format!("dvmlab-plaunch-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let site = Site { dir };
        site.conf("prte.conf", "key");
        let st = Command::new(PCTL)
            .args(["keygen", site.path("key").to_str().unwrap()])
            .output()
            .unwrap();
        assert!(st.status.success(), "{st:?}");
        site
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes prte.conf `name` whose key is the file `key`.
    fn conf(&self, name: &str, key: &str) -> String {
        let text = format!(
            "DVMNodes=n[2:1-2]\nDVMControllerHost=ctl\nDVMKeyFile={}\n",
            self.path(key).display()
        );
        std::fs::write(self.path(name), text).unwrap();
        self.path(name).display().to_string()
    }

    /// A program for the service to start: a shell script that records its arguments in
    /// `started`, then waits until `release` exists (or the site is gone, so that a failed
    /// test leaves nothing running) and exits with the status written there.
    fn daemon(&self) -> String {
        let p = self.path("daemon");
        let script = format!(
            "#!/bin/sh\necho \"$@\" >> {started}\nwhile [ -d {dir} ] && [ ! -e {release} ]; do sleep 0.05; done\ncode=$(cat {release} 2>/dev/null)\nexit ${{code:-0}}\n",
            dir = self.dir.display(),
            started = self.path("started").display(),
            release = self.path("release").display()
        );
        std::fs::write(&p, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.display().to_string()
    }

    fn started(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("started"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running `plaunch serve` on a loopback port of the kernel's choosing; what it logs.
struct Service {
    child: Child,
    addr: String,
    lines: mpsc::Receiver<String>,
    log: Vec<String>,
}

impl Service {
    fn start(conf: &str, args: &[&str]) -> Service {
        let mut child = Command::new(PLAUNCH)
            .args(["serve", "--conf", conf, "--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut s = Service {
            child,
            addr: String::new(),
            lines,
            log: Vec::new(),
        };
        let first = s.wait_line("serving on");
        s.addr = first
            .split("serving on ")
            .nth(1)
            .and_then(|r| r.split(':').next().zip(r.split(':').nth(1)))
            .map(|(ip, port)| format!("{ip}:{port}"))
            .unwrap_or_else(|| panic!("no address in {first:?}"));
        s
    }

    fn port(&self) -> &str {
        self.addr.rsplit(':').next().unwrap()
    }

    /// The next line of the service's log that contains `what` (every line is kept).
    fn wait_line(&mut self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.log.push(l.clone());
                    if l.contains(what) {
                        return l;
                    }
                }
                Err(_) => panic!(
                    "the service never logged {what:?}; it logged:\n{:#?}",
                    self.log
                ),
            }
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `plaunch run --port P localhost ARGV…` with `conf`: (exit code, stderr).
fn run(conf: &str, port: &str, argv: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(PLAUNCH)
        .args(["run", "--conf", conf, "--port", port, "localhost"])
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_key_holder_starts_the_allowed_program_one_at_a_time_and_nothing_else() {
    let site = Site::new("allowed");
    let conf = site.path("prte.conf").display().to_string();
    let daemon = site.daemon();
    let mut svc = Service::start(&conf, &["--allow", &daemon]);

    let (code, err) = run(
        &conf,
        svc.port(),
        &[&daemon, "--bootstrap", "--prtemca", "a b", "1"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("localhost: started pid"), "{err}");
    svc.wait_line("started pid");
    dvmlab_harness::wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        (!site.started().is_empty())
            .then_some(())
            .ok_or(format!("the program never ran: {:#?}", svc.log))
    })
    .unwrap();
    assert_eq!(
        site.started(),
        ["--bootstrap --prtemca a b 1"],
        "its words arrive as they were sent, no shell in between"
    );

    // One at a time: the second is refused while the first runs.
    let (code, err) = run(&conf, svc.port(), &[&daemon]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("refused") && err.contains("still run"),
        "{err}"
    );

    // Anything but the allowed program is refused, however it is named.
    for other in ["/bin/sh", "/bin/true", "daemon"] {
        let (code, err) = run(&conf, svc.port(), &[other, "-c", "touch /tmp/x"]);
        assert_eq!(code, Some(1), "{other}: {err}");
        assert!(
            err.contains(&format!("only {daemon} is started here")),
            "{err}"
        );
    }

    // Once the first has ended, the next may start.
    std::fs::write(site.path("release"), "").unwrap();
    svc.wait_line("ended: exit status: 0");
    std::fs::remove_file(site.path("release")).unwrap();
    let (code, err) = run(&conf, svc.port(), &[&daemon, "second"]);
    assert_eq!(code, Some(0), "{err}");
    std::fs::write(site.path("release"), "").unwrap();
    svc.wait_line("ended");
    assert_eq!(site.started().len(), 2);
}

#[test]
fn a_caller_without_the_key_starts_nothing_and_the_service_goes_on_serving() {
    let site = Site::new("stranger");
    let conf = site.path("prte.conf").display().to_string();
    let other = site.conf("other.conf", "other-key");
    let st = Command::new(PCTL)
        .args(["keygen", site.path("other-key").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(st.status.success());
    let daemon = site.daemon();
    let mut svc = Service::start(&conf, &["--allow", &daemon]);

    let (code, err) = run(&other, svc.port(), &[&daemon]);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("does the service hold this DVM's key"),
        "{err}"
    );
    svc.wait_line("does not hold the DVM key");

    // Bytes that are no handshake, and a caller that says nothing, are dropped alone.
    let mut s = TcpStream::connect(&svc.addr).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    svc.wait_line("key handshake");
    let _silent = TcpStream::connect(&svc.addr).unwrap();

    let (code, err) = run(&conf, svc.port(), &[&daemon]);
    assert_eq!(code, Some(0), "{err}");
    svc.wait_line("started pid");
    std::fs::write(site.path("release"), "").unwrap();
    svc.wait_line("ended");
    assert_eq!(site.started().len(), 1, "only the key holder's launch ran");
}

#[test]
fn stopping_the_service_stops_the_daemons_it_started() {
    let site = Site::new("stop");
    let conf = site.path("prte.conf").display().to_string();
    let daemon = site.daemon();
    let mut svc = Service::start(&conf, &["--allow", &daemon]);
    let (code, err) = run(&conf, svc.port(), &[&daemon]);
    assert_eq!(code, Some(0), "{err}");
    let line = svc.wait_line("started pid");
    let pid: i32 = line.rsplit(' ').next().unwrap().parse().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(svc.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    svc.wait_line(&format!("pid {pid} ended"));
    let status = svc.child.wait().unwrap();
    assert!(status.success(), "{status}: {:#?}", svc.log);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the daemon outlived its service"
    );
}

#[test]
fn without_a_key_it_neither_serves_nor_asks_and_says_why() {
    let site = Site::new("keyless");
    let keyless = site.path("keyless.conf");
    std::fs::write(&keyless, "DVMNodes=n[2:1-2]\nDVMControllerHost=ctl\n").unwrap();
    let keyless = keyless.display().to_string();
    for argv in [
        vec!["serve", "--conf", &keyless, "--listen", "127.0.0.1:0"],
        vec!["run", "--conf", &keyless, "localhost", "/bin/true"],
    ] {
        let o = Command::new(PLAUNCH).args(&argv).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{argv:?}: {err}");
        assert!(err.contains("keyless.conf: no DVMKeyFile"), "{err}");
    }
    // A key others could read is no key.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(site.path("key"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let conf = site.path("prte.conf").display().to_string();
    let o = Command::new(PLAUNCH)
        .args(["serve", "--conf", &conf, "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("lets group or others read"), "{err}");
    // An allowed program that is not there.
    std::fs::set_permissions(site.path("key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = Command::new(PLAUNCH)
        .args([
            "serve",
            "--conf",
            &conf,
            "--listen",
            "127.0.0.1:0",
            "--allow",
            "/no/prted",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--allow /no/prted"), "{err}");
}

#[test]
fn callers_past_the_limit_are_closed_at_once_and_silent_ones_do_not_keep_the_service() {
    use std::io::Read;
    let site = Site::new("callers");
    let conf = site.path("prte.conf").display().to_string();
    let daemon = site.daemon();
    let mut svc = Service::start(&conf, &["--allow", &daemon]);
    let limit = dvmlab_proto::limits::MAX_LAUNCH_CALLERS;
    let silent: Vec<TcpStream> = (0..limit)
        .map(|_| TcpStream::connect(&svc.addr).unwrap())
        .collect();
    let mut extra = TcpStream::connect(&svc.addr).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 8];
    let n = extra.read(&mut buf).expect("closed, not left waiting");
    assert_eq!(n, 0, "the caller past the limit is closed");
    svc.wait_line(&format!("{limit} callers already; closed"));
    // Callers that hang up free their places.
    drop(silent);
    for _ in 0..limit {
        svc.wait_line("closed during the key handshake");
    }
    let (code, err) = run(&conf, svc.port(), &[&daemon]);
    assert_eq!(code, Some(0), "{err}");
    std::fs::write(site.path("release"), "").unwrap();
    svc.wait_line("ended");
}

#[test]
fn a_host_boots_its_own_daemon_and_serves_launches_once_it_left_cleanly() {
    let site = Site::new("boot");
    let conf = site.path("prte.conf").display().to_string();
    let daemon = site.daemon();
    let mut svc = Service::start(&conf, &["--allow", &daemon, "--boot", "--", "--bootstrap"]);
    svc.wait_line("booted pid");
    let (code, err) = run(&conf, svc.port(), &[&daemon]);
    assert_eq!(code, Some(1), "its own daemon counts: {err}");
    assert!(err.contains("still run"), "{err}");
    std::fs::write(site.path("release"), "0").unwrap();
    svc.wait_line("ended: exit status: 0");
    std::fs::remove_file(site.path("release")).unwrap();
    let (code, err) = run(&conf, svc.port(), &[&daemon, "grown"]);
    assert_eq!(code, Some(0), "{err}");
    // A launched daemon that fails is only logged: the host stays up and serves the next.
    std::fs::write(site.path("release"), "5").unwrap();
    svc.wait_line("ended: exit status: 5");
    std::fs::remove_file(site.path("release")).unwrap();
    let (code, err) = run(&conf, svc.port(), &[&daemon, "third"]);
    assert_eq!(code, Some(0), "{err}: {:#?}", svc.log);
    std::fs::write(site.path("release"), "0").unwrap();
    svc.wait_line("ended: exit status: 0");
    assert!(
        !svc.log.iter().any(|l| l.contains("booted failed")),
        "{:#?}",
        svc.log
    );
    assert_eq!(site.started(), ["--bootstrap", "grown", "third"]);
}

#[test]
fn a_booted_daemon_that_fails_takes_its_service_down_so_the_host_is_restarted() {
    let site = Site::new("bootfail");
    let conf = site.path("prte.conf").display().to_string();
    let daemon = site.daemon();
    let mut svc = Service::start(&conf, &["--allow", &daemon, "--boot", "--", "--bootstrap"]);
    svc.wait_line("booted pid");
    std::fs::write(site.path("release"), "3").unwrap();
    svc.wait_line("the daemon it booted failed (exit status: 3)");
    let st = svc.child.wait().unwrap();
    assert_eq!(st.code(), Some(1), "{:#?}", svc.log);
}
