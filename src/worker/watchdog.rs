//! Kills the worker as soon as the main process is gone, whatever the
//! worker is doing (even inside user code that never returns).

use std::time::Duration;

use rustix::event::PollFlags;
use rustix::process::{Pid, PidfdFlags, Signal};

use crate::wire::transport::wait_fd;

/// How often the fallback (no pidfds) checks that the main process exists.
const PROBE: Duration = Duration::from_millis(200);

/// Starts a thread that SIGKILLs this process when `main_pid` exits: it
/// sleeps on a pidfd of the main process (Linux 5.3+), or probes the pid.
pub fn start(main_pid: i32) {
    let me = rustix::process::getpid();
    let kill_self = move || {
        let _ = rustix::process::kill_process(me, Signal::KILL);
    };
    let Some(pid) = Pid::from_raw(main_pid) else {
        return;
    };
    let spawn = |f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name("ferroloader-watchdog".into())
            .spawn(f)
            .ok()
    };
    let opened = if crate::facilities::disabled(crate::facilities::Facility::Pidfd) {
        Err(rustix::io::Errno::NOSYS)
    } else {
        rustix::process::pidfd_open(pid, PidfdFlags::empty())
    };
    match opened {
        Ok(fd) => {
            spawn(Box::new(move || {
                use std::os::fd::AsFd;
                while wait_fd(fd.as_fd(), PollFlags::IN, None).is_err() {}
                kill_self();
            }));
        }
        Err(rustix::io::Errno::SRCH) => kill_self(),
        Err(_) => {
            spawn(Box::new(move || loop {
                std::thread::sleep(PROBE);
                if rustix::process::test_kill_process(pid).is_err() {
                    kill_self();
                }
            }));
        }
    }
}
