//! The daemon's control socket: each connection gets the live statistics as JSON. Only the
//! daemon's own user and root are answered: the socket is mode 0600 in the private run directory,
//! and the peer's credentials are checked on every connection.

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use amaranth_fs::Fs;
use amaranth_fuse::{RequestCounts, Transport};

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
        let v = crate::stat::live_json(fs, counts, transport, image, mp, started);
        let _ = conn.write_all(v.to_string().as_bytes());
    }
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
