//! The daemon's control socket. A client sends one request, a JSON object on one line (or
//! nothing: the statistics), and reads the answer until the daemon closes the connection:
//! - `{"op":"stat"}`: the live statistics as JSON;
//! - `{"op":"remount","read_only":B,"relatime":B,"strictatime":B,"lazytime":B,"sync":B}`: the
//!   file system becomes read-only or writable with these access-time and sync settings (the mount
//!   helper's half of `mount -o remount`); the answer is `{"ok":true}` or `{"error":"..."}`.
//!
//! Only the daemon's own user and root are answered: the socket is mode 0600 in the private run
//! directory, and the peer's credentials are checked on every connection.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use amaranth_fs::Fs;
use amaranth_fuse::{RequestCounts, Transport};
use serde_json::{json, Value};

use crate::files;
use crate::rundir::{self, RunDir};
use crate::util;

/// The control socket and the thread answering it; stopped and removed when dropped.
pub struct Control {
    stop: Arc<AtomicBool>,
    /// The socket's path through the run directory's descriptor (which outlives this).
    path: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Control {
    /// Binds the socket of `mountpoint` in `run` and starts answering (a failure is logged: the
    /// daemon works without it).
    pub fn start(
        fs: Arc<Fs>,
        counts: Arc<RequestCounts>,
        transport: Transport,
        image: &Path,
        mountpoint: &Path,
        started: Instant,
        run: &RunDir,
    ) -> Control {
        let name = rundir::socket_name(mountpoint);
        let path = run.via_fd(&name);
        let stop = Arc::new(AtomicBool::new(false));
        let mut c = Control {
            stop: stop.clone(),
            path: path.clone(),
            thread: None,
        };
        run.remove(&name);
        let bound = UnixListener::bind(&path).and_then(|l| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            Ok(l)
        });
        let listener = match bound {
            Ok(l) => l,
            Err(e) => {
                log::warn!(
                    "amaranth: no control socket {name} in {} ({e}); `amaranth stat` will not \
                     reach this daemon",
                    run.path().display()
                );
                return c;
            }
        };
        let image = image.display().to_string();
        let mp = mountpoint.to_path_buf();
        c.thread = std::thread::Builder::new()
            .name("amaranth-control".into())
            .spawn(move || {
                serve_control(
                    listener,
                    &stop,
                    (&fs, &counts, transport),
                    &image,
                    &mp,
                    started,
                )
            })
            .ok();
        c
    }
}

/// Answers connections until `stop`; a peer that is neither our user nor root gets nothing.
fn serve_control(
    listener: UnixListener,
    stop: &AtomicBool,
    (fs, counts, transport): (&Fs, &RequestCounts, Transport),
    image: &str,
    mp: &Path,
    started: Instant,
) {
    let owner = util::euid();
    let mut refused = 0u64;
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(mut conn) = conn else { continue };
        let peer = files::peer_uid(&conn);
        if !matches!(peer, Ok(uid) if files::may_talk(uid, owner)) {
            refused += 1;
            if refused <= 10 {
                let who = match peer {
                    Ok(uid) => format!("uid {uid}"),
                    Err(e) => format!("an unknown peer ({e})"),
                };
                log::warn!(
                    "amaranth: control socket: refused a connection from {who} (only uid \
                     {owner} and root are answered)"
                );
            }
            continue;
        }
        let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
        let _ = conn.set_read_timeout(Some(REQUEST_WAIT));
        let answer = match read_request(&conn) {
            Ok(req) => answer(&req, (fs, counts, transport), image, mp, started),
            Err(e) => json!({ "error": format!("bad request: {e}") }),
        };
        let _ = conn.write_all(answer.to_string().as_bytes());
    }
}

/// How long a client may take to send its request; one that sends nothing asks for statistics.
const REQUEST_WAIT: Duration = Duration::from_secs(1);

/// The request on one line; none (the client shut its side, or sent nothing within
/// [`REQUEST_WAIT`]: an older client) asks for statistics.
fn read_request(conn: &UnixStream) -> io::Result<Value> {
    let mut line = String::new();
    match BufReader::new(conn.take(64 << 10)).read_line(&mut line) {
        Ok(_) => {}
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) && line.is_empty() => {}
        Err(e) => return Err(e),
    }
    if line.trim().is_empty() {
        return Ok(json!({ "op": "stat" }));
    }
    serde_json::from_str(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn answer(
    req: &Value,
    (fs, counts, transport): (&Fs, &RequestCounts, Transport),
    image: &str,
    mp: &Path,
    started: Instant,
) -> Value {
    match req["op"].as_str() {
        Some("stat") => crate::stat::live_json(fs, counts, transport, image, mp, started),
        Some("remount") => match remount(req, fs) {
            Ok(()) => json!({ "ok": true }),
            Err(e) => {
                log::error!("amaranth: remount of {} failed: {e}", mp.display());
                json!({ "error": e })
            }
        },
        _ => json!({ "error": format!("unknown request {req}") }),
    }
}

/// The daemon's half of `mount -o remount`.
fn remount(req: &Value, fs: &Fs) -> Result<(), String> {
    let flag = |k: &str| {
        req[k]
            .as_bool()
            .ok_or_else(|| format!("remount request without {k:?}"))
    };
    let read_only = flag("read_only")?;
    let modes = amaranth_fs::Modes {
        relatime: flag("relatime")?,
        strictatime: flag("strictatime")?,
        lazytime: flag("lazytime")?,
        sync: flag("sync")?,
    };
    // Writable first, so that access times kept in memory are written before read-only.
    if !read_only {
        fs.set_read_only(false)
            .map_err(|e| format!("{e}; the file system stays read-only"))?;
    }
    fs.set_modes(modes);
    if read_only {
        fs.set_read_only(true).map_err(|e| e.to_string())?;
    }
    log::info!(
        "amaranth: remounted {} ({modes:?})",
        if read_only { "read-only" } else { "read-write" }
    );
    Ok(())
}

/// Sends `req` to the daemon of `mp` (through the socket in our run directory; the daemon must be
/// run by us or by root) and returns its answer.
pub fn request(mp: &Path, req: &Value) -> io::Result<Value> {
    let run = RunDir::existing()
        .map_err(|f| io::Error::new(io::ErrorKind::PermissionDenied, f.message))?
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no run directory"))?;
    let mut s = UnixStream::connect(run.via_fd(&rundir::socket_name(mp)))?;
    let peer = files::peer_uid(&s)?;
    if !files::may_talk(peer, util::euid()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the socket is served by uid {peer}, neither you nor root"),
        ));
    }
    s.write_all(format!("{req}\n").as_bytes())?;
    s.shutdown(std::net::Shutdown::Write)?;
    // A remount writes a checkpoint: give it time.
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    serde_json::from_str(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

impl Drop for Control {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // Wake the accept loop.
            let _ = std::os::unix::net::UnixStream::connect(&self.path);
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
