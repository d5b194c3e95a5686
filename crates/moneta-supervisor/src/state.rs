//! An instance's state directory, `<run dir>/<name>/`: its JSON records,
//! each written through a temporary file and a rename (a reader never sees
//! half of one), and the lock `<run dir>/.lock-<name>` that serializes the
//! commands bringing the instance up and down.

use crate::{Error, ErrorKind, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The directory of one instance and its lock file.
#[derive(Clone, Debug)]
pub struct StateDir {
    pub dir: PathBuf,
    pub lock: PathBuf,
}

impl StateDir {
    /// `run/name`, locked by `run/.lock-name` (the lock file lives beside
    /// the directory, so it can be taken before the directory exists).
    pub fn new(run: &Path, name: &str) -> StateDir {
        StateDir {
            dir: run.join(name),
            lock: run.join(format!(".lock-{name}")),
        }
    }

    /// A file in the directory.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// Take the instance's lock, waiting for whoever holds it; `waiting`
    /// names the holder for the message printed while waiting ("moneta
    /// up/down on /mnt/x").
    pub fn lock(&self, waiting: &str) -> Result<Lock> {
        Lock::take(&self.lock, &self.dir, waiting)
    }

    /// [`read_json`] of a file in the directory.
    pub fn read_json<T: DeserializeOwned>(&self, file: &str) -> Result<Option<T>> {
        read_json(&self.path(file))
    }

    /// [`write_json`] of a file in the directory.
    pub fn write_json<T: Serialize>(&self, file: &str, value: &T) -> Result<()> {
        write_json(&self.path(file), value)
    }
}

/// A JSON record; `None` when the file does not exist.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::with_source(ErrorKind::Corrupt, path.display().to_string(), e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path.display().to_string(), e)),
    }
}

/// Write a JSON record atomically ([`write_atomic`]), pretty, one line
/// feed at the end.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| {
        Error::with_source(ErrorKind::Corrupt, format!("writing {}", path.display()), e)
    })?;
    write_atomic(path, (text + "\n").as_bytes())
}

/// Write through `<path>.tmp` and rename, so a reader never sees half.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, bytes)
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = fs::remove_file(&tmp);
            Error::io(format!("writing {}", path.display()), e)
        })
}

/// Serializes `up` and `down` of one instance. The lock file lives as
/// long as the state directory: whoever holds the lock when the directory
/// is gone deletes the file, and a waiter then finds that the file it
/// locked is no longer the one at the path, and locks afresh. The
/// descriptor is close-on-exec (as all of std's), so a daemon started
/// while it is held does not inherit the lock.
pub struct Lock {
    _file: fs::File,
    path: PathBuf,
    dir: PathBuf,
}

impl Lock {
    /// Lock `path` (the lock of state directory `dir`), waiting for
    /// whoever holds it.
    pub fn take(path: &Path, dir: &Path, waiting: &str) -> Result<Lock> {
        let mut told = false;
        loop {
            let f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path)
                .map_err(|e| Error::io(path.display().to_string(), e))?;
            // SAFETY: flock(2) on a descriptor we own.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                if !told {
                    eprintln!("moneta: waiting for another {waiting}");
                    told = true;
                }
                // SAFETY: as above.
                if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
                    return Err(Error::io(
                        format!("locking {}", path.display()),
                        io::Error::last_os_error(),
                    ));
                }
            }
            let same = match (f.metadata(), fs::metadata(path)) {
                (Ok(held), Ok(now)) => held.dev() == now.dev() && held.ino() == now.ino(),
                _ => false,
            };
            if same {
                return Ok(Lock {
                    _file: f,
                    path: path.to_path_buf(),
                    dir: dir.to_path_buf(),
                });
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if !self.dir.exists() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    fn scratch(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("moneta-supervisor-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn records_round_trip_atomically_and_a_bad_one_is_a_corrupt_error() {
        let run = scratch("json");
        let sd = StateDir::new(&run, "inst");
        fs::create_dir(&sd.dir).unwrap();
        assert!(sd.read_json::<Vec<u32>>("state.json").unwrap().is_none());
        sd.write_json("state.json", &vec![1u32, 2, 3]).unwrap();
        assert_eq!(
            sd.read_json::<Vec<u32>>("state.json").unwrap(),
            Some(vec![1, 2, 3])
        );
        let text = fs::read_to_string(sd.path("state.json")).unwrap();
        assert!(text.ends_with("]\n"), "{text:?}");
        assert!(!sd.path("state.json.tmp").exists());
        fs::write(sd.path("bad.json"), "{not json").unwrap();
        let e = sd.read_json::<Vec<u32>>("bad.json").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e
            .to_string()
            .starts_with(&sd.path("bad.json").display().to_string()));
        // A write that cannot land leaves no temporary file behind.
        let e = write_json(&run.join("missing/x.json"), &1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn the_lock_serializes_and_goes_with_its_directory() {
        let run = scratch("lock");
        let sd = StateDir::new(&run, "inst");
        fs::create_dir(&sd.dir).unwrap();
        let held = sd.lock("test holder").unwrap();
        let (tx, rx) = mpsc::channel();
        let sd2 = sd.clone();
        let waiter = std::thread::spawn(move || {
            let l = sd2.lock("test waiter").unwrap();
            tx.send(()).unwrap();
            drop(l);
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "two held the lock"
        );
        // The holder removes the instance: its lock file goes with it, and
        // the waiter locks a new file rather than the deleted one.
        fs::remove_dir_all(&sd.dir).unwrap();
        drop(held);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the waiter got the lock");
        waiter.join().unwrap();
        assert!(!sd.lock.exists());
        fs::remove_dir_all(&run).unwrap();
    }
}
