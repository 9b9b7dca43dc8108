//! One supervisor for every stage, and the one retry policy keyed on [`ErrorClass`].
//!
//! A stage runs sessions (capture, bronze) or rounds (silver). When one ends with an
//! error, [`policy`] decides from the error's class alone:
//!
//! - **transient** (broker, registry, database or storage briefly unavailable): wait with
//!   [`Backoff`] and run again. Nothing was acknowledged for the failed work, so it is
//!   redone; the backoff starts over once a session made progress.
//! - **operator** (configuration, privileges, a lost slot): stop the stage and surface the
//!   reason and its fix: `wal2delta_stage_failed`, `/readyz`, and the error the stage
//!   returns (logged at ERROR while other stages go on, printed as the daemon's one error
//!   line when it was the last). The other stages go on (Bronze and Silver drain what
//!   Kafka holds while capture waits for a fix); the daemon exits, non-zero, once no stage
//!   runs.
//! - **record**: a stage routes such errors to the DLQ or the quarantine itself; one that
//!   reaches the stage boundary was not routed (a bug), and retrying would only meet it
//!   again, so it stops the stage like an operator error.

mod backoff;
pub mod stages;
mod tables;

use std::fmt::Display;

use tokio::sync::watch;
use wal2delta_model::ErrorClass;

pub use backoff::Backoff;
pub use stages::{Stages, State};
pub use tables::{OperatorErrors, TableNext, TableRetries};

use crate::cli::Stage;
use crate::events::{
    class_label, InternalEvent, StageRetrying, StageSessionFailed, StageStopped, StageSupervised,
};

/// An error that can end a stage's session.
pub trait StageError: Display {
    fn class(&self) -> ErrorClass;
    /// What an operator should do about it, when known.
    fn hint(&self) -> Option<String> {
        None
    }
}

impl StageError for wal2delta_lake::LakeError {
    fn class(&self) -> ErrorClass {
        wal2delta_lake::LakeError::class(self)
    }

    fn hint(&self) -> Option<String> {
        match self {
            wal2delta_lake::LakeError::Uri { .. } => Some("fix [lake] uri".into()),
            _ => None,
        }
    }
}

/// What the supervisor does after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Wait, then run again.
    Retry,
    /// Stop the stage; an operator must act.
    Stop,
}

/// The retry policy: one rule per error class.
pub fn policy(class: ErrorClass) -> Action {
    match class {
        ErrorClass::Transient => Action::Retry,
        ErrorClass::Operator | ErrorClass::Record => Action::Stop,
    }
}

/// What the stage's loop does next.
#[derive(Debug)]
pub enum Next {
    /// Run the next session.
    Retry,
    /// Shutdown was requested while waiting.
    Shutdown,
    /// The stage stops with this error (already logged and surfaced).
    Stop(anyhow::Error),
}

/// How a stage goes on after a transient failure (for the log).
fn resumes(stage: Stage) -> &'static str {
    match stage {
        Stage::Capture => "restarting from the slot's confirmed position",
        Stage::Bronze => "restarting from the offsets stored in the Bronze tables",
        Stage::Silver | Stage::Gold | Stage::Rules => {
            "the round is retried from the progress its tables recorded"
        }
    }
}

/// Drives one stage's retries and keeps its status.
pub struct Supervisor {
    stage: Stage,
    stages: Stages,
    /// Behind a lock so the stage's session can report progress through `&self`.
    backoff: std::sync::Mutex<Backoff>,
}

impl Supervisor {
    pub fn new(stage: Stage, stages: &Stages) -> Self {
        StageSupervised {
            stage: stages::stage_name(stage),
        }
        .emit();
        Supervisor {
            stage,
            stages: stages.clone(),
            backoff: std::sync::Mutex::new(Backoff::standard()),
        }
    }

    /// The stage made progress (connected and streaming, committed, a round applied): it
    /// is running, and the next failure starts the backoff over.
    pub fn healthy(&self) {
        self.backoff
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reset();
        self.stages.update(self.stage, |st| {
            st.state = State::Running;
            st.failures = 0;
        });
    }

    /// A session started. It counts as healthy once it made progress ([`Self::healthy`])
    /// or ran for [`stages::HEALTHY_AFTER`] without failing.
    pub fn started(&self) {
        self.stages
            .update(self.stage, |st| st.state = State::Running);
    }

    /// The stage ended on request.
    pub fn stopped(&self) {
        self.stages
            .update(self.stage, |st| st.state = State::Stopped);
    }

    /// Applies the policy to a session's failure: logs it, counts it, and waits before
    /// the next attempt (or stops the stage).
    pub async fn failed(
        &self,
        error: &dyn StageError,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Next {
        let stage = stages::stage_name(self.stage);
        let class = error.class();
        StageSessionFailed { stage, class }.emit();
        let message = error.to_string();
        if self
            .stages
            .get(self.stage)
            .is_some_and(|st| st.healthy_for_long())
        {
            self.healthy();
        }
        match policy(class) {
            Action::Retry => {
                let wait = self
                    .backoff
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .next_wait();
                self.stages.update(self.stage, |st| {
                    st.state = State::Retrying;
                    st.failures += 1;
                    st.last_error = Some(message.clone());
                });
                StageRetrying {
                    stage,
                    error: &message,
                    wait,
                    resumes: resumes(self.stage),
                }
                .emit();
                tokio::select! {
                    _ = tokio::time::sleep(wait) => Next::Retry,
                    _ = shutdown.changed() => {
                        self.stopped();
                        Next::Shutdown
                    }
                }
            }
            Action::Stop => Next::Stop(self.stop(error, class_label(class))),
        }
    }

    /// The lake for a stage that writes it: a bad `[lake]` setting or a store on which
    /// concurrent Delta commits are not safe stops the stage (`Err`); a store that cannot
    /// be reached yet is retried with the stage's backoff. `Ok(None)` on shutdown (the
    /// stage is then marked stopped).
    pub async fn writable_lake(
        &self,
        config: &crate::config::LakeConfig,
        shutdown: &mut watch::Receiver<bool>,
    ) -> anyhow::Result<Option<wal2delta_lake::Lake>> {
        loop {
            match config.open_for_writing().await {
                Ok(lake) => return Ok(Some(lake)),
                Err(e) if e.class() == ErrorClass::Transient => {
                    match self.failed(&e, shutdown).await {
                        Next::Retry => continue,
                        Next::Shutdown => {
                            self.stopped();
                            return Ok(None);
                        }
                        Next::Stop(err) => return Err(err),
                    }
                }
                Err(e) => return self.stop_now(&e).map(|()| None),
            }
        }
    }

    /// Stops the stage at once for an error met before any session (a bad setting).
    pub fn stop_now(&self, error: &dyn StageError) -> anyhow::Result<()> {
        Err(self.stop(error, "operator"))
    }

    /// Marks the stage failed and says why, with the fix when known.
    fn stop(&self, error: &dyn StageError, class: &'static str) -> anyhow::Error {
        let stage = stages::stage_name(self.stage);
        let (message, hint) = (error.to_string(), error.hint());
        self.stages.update(self.stage, |st| {
            st.state = State::Failed;
            st.failures += 1;
            st.last_error = Some(message.clone());
            st.hint = hint.clone();
        });
        let shown = match &hint {
            Some(h) => format!("{message} (hint: {h})"),
            None => message,
        };
        StageStopped {
            stage,
            class,
            error: &shown,
        }
        .emit();
        anyhow::anyhow!("{stage} stage stopped, it needs an operator: {shown}")
    }

    /// A table's own work failed while the stage goes on (the table is retried after its
    /// own backoff): shown in the stage's status.
    pub fn table_failed(&self, table: &str, error: &dyn Display) {
        let e = error.to_string();
        self.stages.update(self.stage, |st| {
            let entry = st
                .failing_tables
                .entry(table.to_owned())
                .or_insert((0, String::new()));
            entry.0 += 1;
            entry.1 = e;
        });
    }

    /// A table that failed before succeeded again (callers know it was failing).
    pub fn table_ok(&self, table: &str) {
        self.stages.update(self.stage, |st| {
            st.failing_tables.remove(table);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E(ErrorClass);
    impl Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{:?} failure", self.0)
        }
    }
    impl StageError for E {
        fn class(&self) -> ErrorClass {
            self.0
        }
        fn hint(&self) -> Option<String> {
            Some("fix it".into())
        }
    }

    #[test]
    fn only_transient_failures_are_retried() {
        assert_eq!(policy(ErrorClass::Transient), Action::Retry);
        assert_eq!(policy(ErrorClass::Operator), Action::Stop);
        assert_eq!(policy(ErrorClass::Record), Action::Stop);
    }

    #[tokio::test]
    async fn a_transient_failure_retries_and_an_operator_error_stops_with_its_hint() {
        let stages = Stages::new(&[Stage::Bronze]);
        let sup = Supervisor::new(Stage::Bronze, &stages);
        let (_tx, mut rx) = watch::channel(false);
        sup.healthy();
        assert!(matches!(
            sup.failed(&E(ErrorClass::Transient), &mut rx).await,
            Next::Retry
        ));
        let st = stages.get(Stage::Bronze).unwrap();
        assert_eq!((st.state, st.failures), (State::Retrying, 1));
        match sup.failed(&E(ErrorClass::Operator), &mut rx).await {
            Next::Stop(e) => assert!(e.to_string().contains("hint: fix it"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(stages.get(Stage::Bronze).unwrap().state, State::Failed);
        assert!(stages.not_ready_reason().unwrap().contains("failed"));
    }

    #[tokio::test]
    async fn shutdown_ends_the_wait() {
        let stages = Stages::new(&[Stage::Capture]);
        let sup = Supervisor::new(Stage::Capture, &stages);
        let (tx, mut rx) = watch::channel(false);
        let _ = tx.send(true);
        assert!(matches!(
            sup.failed(&E(ErrorClass::Transient), &mut rx).await,
            Next::Shutdown
        ));
        assert_eq!(stages.get(Stage::Capture).unwrap().state, State::Stopped);
    }
}
