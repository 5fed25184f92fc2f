//! Where a run's time goes, phase by phase: the figures `results.json` keeps under `phases`
//! and `ssl run` prints under its table.
//!
//! The trainer installs a [`Clock`] on its thread for the run; the step's functions time
//! their parts with [`timed`], which costs two clock reads and does nothing where no clock is
//! installed (a step called from a test or a bench). The views are made on the loader's own
//! thread, ahead of the steps: their time overlaps the step's, and what the step waited for
//! them is [`Phase::DataWait`].
//!
//! On the CPU every op has finished when its call returns, so a phase's time is its work. A
//! GPU queues kernels: there the phases are the host's time to queue them, and the wait for
//! them lands wherever the host first reads a result back.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One part of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The networks, the optimiser and the run directory (the data are read before).
    Setup,
    /// The views' augmentation, on the loader thread (overlaps the steps).
    Views,
    /// A step waiting for its batch of views.
    DataWait,
    /// The encoder and projector on every view (and a teacher's); for an objective that
    /// encodes the views itself (MAE, I-JEPA), its whole loss.
    Forward,
    /// The objective's loss and the online probe's, and their backward to the views' outputs.
    Loss,
    /// Every view's backward pass through its encoder and projector.
    Backward,
    /// The optimiser step with the objective's hooks (EMA teachers, queues).
    Optimiser,
    /// The epoch monitor: clean images embedded, the k-NN and the online probe read.
    Monitor,
    /// Checkpoints and logs written.
    Checkpoint,
    /// The end-of-run table, baselines included.
    Evaluation,
}

impl Phase {
    const ALL: [Phase; 10] = [
        Phase::Setup,
        Phase::Views,
        Phase::DataWait,
        Phase::Forward,
        Phase::Loss,
        Phase::Backward,
        Phase::Optimiser,
        Phase::Monitor,
        Phase::Checkpoint,
        Phase::Evaluation,
    ];

    /// The key in `results.json`.
    pub fn key(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::Views => "views",
            Phase::DataWait => "data_wait",
            Phase::Forward => "forward",
            Phase::Loss => "loss",
            Phase::Backward => "backward",
            Phase::Optimiser => "optimiser",
            Phase::Monitor => "monitor",
            Phase::Checkpoint => "checkpoint",
            Phase::Evaluation => "evaluation",
        }
    }
}

/// Seconds per phase, shared between the trainer's thread and the loader's.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    nanos: Arc<[AtomicU64; Phase::ALL.len()]>,
}

impl Clock {
    /// Adds the time since `since` to `phase`.
    pub fn add(&self, phase: Phase, since: Instant) {
        self.add_duration(phase, since.elapsed());
    }

    /// Adds `duration` to `phase`.
    pub fn add_duration(&self, phase: Phase, duration: Duration) {
        let nanos = duration.as_nanos().min(u64::MAX as u128) as u64;
        self.nanos[phase as usize].fetch_add(nanos, Ordering::Relaxed);
    }

    /// Installs this clock for [`timed`] on the calling thread until the guard drops.
    pub fn install(&self) -> Installed {
        let previous = CLOCK.with(|c| c.replace(Some(self.clone())));
        Installed { previous }
    }

    /// The seconds so far.
    pub fn seconds(&self) -> PhaseSeconds {
        PhaseSeconds(
            Phase::ALL
                .iter()
                .map(|&p| {
                    (
                        p.key(),
                        self.nanos[p as usize].load(Ordering::Relaxed) as f64 * 1e-9,
                    )
                })
                .collect(),
        )
    }
}

thread_local! {
    static CLOCK: RefCell<Option<Clock>> = const { RefCell::new(None) };
}

/// Keeps a [`Clock`] installed; the one before comes back when it drops.
pub struct Installed {
    previous: Option<Clock>,
}

impl Drop for Installed {
    fn drop(&mut self) {
        CLOCK.with(|c| *c.borrow_mut() = self.previous.take());
    }
}

/// The clock installed on this thread, or a fresh one nothing reads.
pub fn current() -> Clock {
    CLOCK.with(|c| c.borrow().clone()).unwrap_or_default()
}

/// `f()`, its time added to `phase` of the thread's clock, if one is installed.
pub fn timed<T>(phase: Phase, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    add_since(phase, started);
    out
}

/// Adds the time since `started` to `phase` of the thread's clock, if one is installed.
pub fn add_since(phase: Phase, started: Instant) {
    CLOCK.with(|c| {
        if let Some(clock) = c.borrow().as_ref() {
            clock.add(phase, started);
        }
    });
}

/// Seconds per phase, in the order of [`Phase`].
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseSeconds(Vec<(&'static str, f64)>);

impl PhaseSeconds {
    /// The seconds of `phase`.
    pub fn get(&self, phase: Phase) -> f64 {
        self.0[phase as usize].1
    }

    /// Phase key → seconds.
    pub fn to_map(&self) -> std::collections::BTreeMap<String, f64> {
        (self.0.iter())
            .map(|(k, s)| (k.to_string(), (s * 1e3).round() / 1e3))
            .collect()
    }

    /// One line for a terminal: each phase that took any time, with its seconds.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = (self.0.iter())
            .filter(|(_, s)| *s >= 0.05)
            .map(|(k, s)| format!("{} {s:.1} s", k.replace('_', " ")))
            .collect();
        parts.join(" · ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_adds_to_the_installed_clock_alone_and_the_guard_restores_the_one_before() {
        let nap = || std::thread::sleep(Duration::from_millis(20));
        timed(Phase::Forward, nap);
        let (outer, inner) = (Clock::default(), Clock::default());
        {
            let _outer = outer.install();
            {
                let _inner = inner.install();
                timed(Phase::Backward, nap);
            }
            timed(Phase::Forward, nap);
        }
        timed(Phase::Forward, nap);
        let (o, i) = (outer.seconds(), inner.seconds());
        assert!(
            o.get(Phase::Forward) >= 0.02 && o.get(Phase::Forward) < 0.04,
            "{o:?}"
        );
        assert_eq!(o.get(Phase::Backward), 0.0);
        assert!(i.get(Phase::Backward) >= 0.02, "{i:?}");
        assert_eq!(i.get(Phase::Forward), 0.0);
    }

    #[test]
    fn another_threads_share_lands_in_the_same_clock() {
        let clock = Clock::default();
        let handle = clock.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            std::thread::sleep(Duration::from_millis(10));
            handle.add(Phase::Views, started);
        })
        .join()
        .unwrap();
        assert!(clock.seconds().get(Phase::Views) >= 0.01);
        let map = clock.seconds().to_map();
        assert_eq!(map.len(), 10);
        assert!(map.contains_key("data_wait") && map["evaluation"] == 0.0);
    }
}
