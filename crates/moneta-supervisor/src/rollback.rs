//! The undo of every step taken so far, run newest first when the guard is
//! dropped before [`Rollback::commit`]: an error return, a panic, an
//! interrupt. `moneta up` and `moneta san up` register each piece they make.

use std::fmt::Display;

type Undo = Box<dyn FnOnce() -> Option<String>>;

#[derive(Default)]
pub struct Rollback {
    undo: Vec<(String, Undo)>,
}

impl Rollback {
    /// Register the undo of a step; `what` says what it does ("removed X").
    pub fn push<E: Display>(
        &mut self,
        what: impl Into<String>,
        undo: impl FnOnce() -> Result<(), E> + 'static,
    ) {
        self.undo.push((
            what.into(),
            Box::new(move || undo().err().map(|e| e.to_string())),
        ));
    }

    /// Steps registered and not yet undone.
    pub fn len(&self) -> usize {
        self.undo.len()
    }

    pub fn is_empty(&self) -> bool {
        self.undo.is_empty()
    }

    /// Everything went through: keep it all.
    pub fn commit(mut self) {
        self.undo.clear();
    }
}

impl Drop for Rollback {
    fn drop(&mut self) {
        while let Some((what, undo)) = self.undo.pop() {
            match undo() {
                None => eprintln!("moneta: rolled back: {what}"),
                Some(e) => eprintln!("moneta: rolling back ({what}) failed: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    #[test]
    fn undoes_newest_first_even_when_one_fails_and_commit_keeps_all() {
        let log = Rc::new(RefCell::new(Vec::new()));
        {
            let mut rb = Rollback::default();
            for i in 0..3 {
                let l = log.clone();
                rb.push(format!("step {i}"), move || {
                    l.borrow_mut().push(i);
                    if i == 1 {
                        Err("refused")
                    } else {
                        Ok(())
                    }
                });
            }
            assert_eq!(rb.len(), 3);
        }
        assert_eq!(*log.borrow(), vec![2, 1, 0]);

        let l = log.clone();
        let mut rb = Rollback::default();
        rb.push("kept", move || {
            l.borrow_mut().push(9);
            Ok::<(), String>(())
        });
        rb.commit();
        assert_eq!(*log.borrow(), vec![2, 1, 0]);
    }

    #[test]
    fn a_panic_runs_the_undo() {
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f = flag.clone();
        let r = std::panic::catch_unwind(move || {
            let mut rb = Rollback::default();
            rb.push("set the flag", move || {
                f.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok::<(), String>(())
            });
            panic!("a step panicked");
        });
        assert!(r.is_err());
        assert!(flag.load(std::sync::atomic::Ordering::SeqCst));
    }
}
