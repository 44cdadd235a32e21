//! The Linux facilities the engine uses beyond POSIX, and a switch that
//! makes it act as if the kernel lacked them: `FERROLOADER_DISABLE` lists
//! them, comma-separated (`memfd`, `pidfd`), so tests and users on an
//! unusual system can see what happens without one. Without `memfd_create`
//! (Linux 3.17) loading with workers, processes or threads, raises a clear
//! error (one process still works); without `pidfd_open` (Linux 5.3) worker and main-process
//! deaths are found by probing the pid instead.

use std::sync::OnceLock;

/// A facility that can be disabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Facility {
    Memfd,
    Pidfd,
}

impl Facility {
    fn name(self) -> &'static str {
        match self {
            Facility::Memfd => "memfd",
            Facility::Pidfd => "pidfd",
        }
    }
}

/// Whether `FERROLOADER_DISABLE` names `f` (read once per process).
pub fn disabled(f: Facility) -> bool {
    static LIST: OnceLock<Vec<String>> = OnceLock::new();
    LIST.get_or_init(|| crate::settings::disable_env().unwrap_or_default())
        .iter()
        .any(|s| s == f.name())
}
