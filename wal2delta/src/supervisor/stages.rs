//! What each stage is doing, for readiness (`/readyz`), `status` and the stage metrics.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::{json, Value};

use crate::cli::Stage;
use crate::events::{InternalEvent, StageStatusChanged};

/// A stage failing this many times in a row (or a table failing this many rounds in a
/// row) makes the daemon not ready: one broker blip does not flap readiness.
pub const NOT_READY_AFTER_FAILURES: u32 = 3;

/// A session that has run this long without failing counts as healthy: its end starts
/// the failure count (and the backoff) over.
pub const HEALTHY_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Connecting or reading its start position.
    Starting,
    /// Working.
    Running,
    /// The last session ended with a transient failure; waiting to start the next.
    Retrying,
    /// Stopped for an error that needs an operator (the reason says what to fix).
    Failed,
    /// Stopped on request.
    Stopped,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Running => "running",
            State::Retrying => "retrying",
            State::Failed => "failed",
            State::Stopped => "stopped",
        }
    }
}

/// One stage's status.
#[derive(Debug, Clone)]
pub struct StageStatus {
    pub state: State,
    /// Failures since the last success.
    pub failures: u32,
    /// The last failure (an error message: names tables and settings, never row values).
    pub last_error: Option<String>,
    /// What the operator should do, for a failed stage.
    pub hint: Option<String>,
    pub since: SystemTime,
    /// Tables whose own work keeps failing while the stage goes on: failures in a row and
    /// the last error.
    pub failing_tables: BTreeMap<String, (u32, String)>,
}

impl StageStatus {
    fn new(state: State) -> Self {
        StageStatus {
            state,
            failures: 0,
            last_error: None,
            hint: None,
            since: SystemTime::now(),
            failing_tables: BTreeMap::new(),
        }
    }

    /// Running, without a failure, for [`HEALTHY_AFTER`].
    pub fn healthy_for_long(&self) -> bool {
        self.state == State::Running && self.since.elapsed().is_ok_and(|d| d >= HEALTHY_AFTER)
    }

    /// Why the stage makes the daemon not ready, if it does.
    pub fn not_ready_reason(&self) -> Option<String> {
        let error = self.last_error.as_deref().unwrap_or("");
        match self.state {
            State::Running | State::Retrying if self.failures < NOT_READY_AFTER_FAILURES => {}
            State::Running if self.healthy_for_long() => {}
            State::Starting => return Some("starting".into()),
            State::Stopped => return Some("stopped".into()),
            State::Failed => return Some(format!("failed: {error}")),
            State::Running | State::Retrying => {
                return Some(format!("{} failures in a row: {error}", self.failures))
            }
        }
        self.failing_tables
            .iter()
            .find(|(_, (n, _))| *n >= NOT_READY_AFTER_FAILURES)
            .map(|(t, (n, e))| format!("table {t}: {n} failures in a row: {e}"))
    }

    fn to_json(&self) -> Value {
        let since = self
            .since
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let tables: BTreeMap<_, _> = self
            .failing_tables
            .iter()
            .map(|(t, (n, e))| (t.clone(), json!({ "failures": n, "last_error": e })))
            .collect();
        json!({
            "state": self.state.as_str(),
            "ready": self.not_ready_reason().is_none(),
            "reason": self.not_ready_reason(),
            "failures": self.failures,
            "last_error": self.last_error,
            "hint": self.hint,
            "since_ms": since,
            "failing_tables": tables,
        })
    }
}

/// The statuses of the stages this daemon runs, shared by the stages (writers) and the
/// endpoint (reader).
#[derive(Debug, Clone, Default)]
pub struct Stages(Arc<Mutex<BTreeMap<&'static str, StageStatus>>>);

impl Stages {
    /// Registers the stages the daemon runs, all starting.
    pub fn new(stages: &[Stage]) -> Self {
        let s = Stages::default();
        for stage in stages {
            s.update(*stage, |st| *st = StageStatus::new(State::Starting));
        }
        s
    }

    /// Changes one stage's status and the stage metrics with it.
    pub fn update(&self, stage: Stage, f: impl FnOnce(&mut StageStatus)) {
        let name = stage_name(stage);
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let st = map
            .entry(name)
            .or_insert_with(|| StageStatus::new(State::Starting));
        let before = st.state;
        f(st);
        if st.state != before {
            st.since = SystemTime::now();
        }
        StageStatusChanged {
            stage: name,
            up: st.state == State::Running,
            failed: st.state == State::Failed,
            failing_tables: st.failing_tables.len(),
        }
        .emit();
    }

    pub fn get(&self, stage: Stage) -> Option<StageStatus> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(stage_name(stage)).cloned()
    }

    /// `None` when every stage is ready, else the first reason.
    pub fn not_ready_reason(&self) -> Option<String> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.is_empty() {
            return Some("no stage runs".into());
        }
        map.iter()
            .find_map(|(name, st)| st.not_ready_reason().map(|r| format!("{name}: {r}")))
    }

    /// The `/readyz` document.
    pub fn to_json(&self) -> Value {
        let reason = self.not_ready_reason();
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let stages: BTreeMap<_, _> = map.iter().map(|(n, s)| (*n, s.to_json())).collect();
        json!({ "ready": reason.is_none(), "reason": reason, "stages": stages })
    }
}

pub fn stage_name(stage: Stage) -> &'static str {
    match stage {
        Stage::Capture => "capture",
        Stage::Bronze => "bronze",
        Stage::Silver => "silver",
        Stage::Gold => "gold",
        Stage::Rules => "rules",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_stage_runs_without_repeated_failures() {
        let s = Stages::new(&[Stage::Capture, Stage::Bronze]);
        assert!(s.not_ready_reason().unwrap().contains("starting"));
        s.update(Stage::Capture, |st| st.state = State::Running);
        s.update(Stage::Bronze, |st| st.state = State::Running);
        assert_eq!(s.not_ready_reason(), None);
        // One transient failure does not flap readiness; three in a row do.
        s.update(Stage::Bronze, |st| {
            st.state = State::Retrying;
            st.failures = 1;
            st.last_error = Some("broker down".into());
        });
        assert_eq!(s.not_ready_reason(), None);
        s.update(Stage::Bronze, |st| st.failures = 3);
        assert!(s.not_ready_reason().unwrap().contains("bronze: 3 failures"));
        s.update(Stage::Bronze, |st| {
            st.state = State::Running;
            st.failures = 0;
            st.failing_tables
                .insert("public.t".into(), (3, "disk full".into()));
        });
        assert!(s.not_ready_reason().unwrap().contains("table public.t"));
        s.update(Stage::Capture, |st| st.state = State::Failed);
        let doc = s.to_json();
        assert_eq!(doc["ready"], false);
        assert_eq!(doc["stages"]["capture"]["state"], "failed");
    }
}
