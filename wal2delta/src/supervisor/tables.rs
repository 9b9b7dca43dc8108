//! One table's failures while its stage goes on: the per-table side of [`policy`].
//!
//! Bronze commits, Silver rounds (and Silver tables being opened) and Gold refreshes fail
//! one table (or model) at a time. [`TableRetries`] decides from the error's class with the
//! stage's [`policy`], keeps each failing table's own [`Backoff`] and shows the table in the
//! stage's status (`failing_tables`, `/readyz`).
//!
//! - What the policy retries (transient) is retried after the table's backoff.
//! - What the policy stops on (record, operator) was not routed by the stage, or needs an
//!   operator. Where it stops is the one difference between the stages, the
//!   [`OperatorErrors`] the stage gives: an operator error of a Bronze commit is about the
//!   lake every table writes, so the stage stops; one of a Silver table or a Gold model is
//!   about that table's own settings (a quality check, a masking policy, the model's SQL),
//!   so only that table is held. A held table is tried again after its backoff, so a fix
//!   that needs no restart (a Bronze table replaced, a quarantine record resolved) is seen
//!   without one, and the other tables go on.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;
use wal2delta_model::ErrorClass;

use super::{policy, Action, Backoff, StageError, Supervisor};

/// What an operator error of one table stops (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorErrors {
    /// The stage stops: the error is about what every table shares (Bronze: the lake).
    StopTheStage,
    /// Only the table is held: the error is about the table's own settings (Silver's
    /// checks and policies, a Gold model's SQL).
    HoldTheTable,
}

/// What a table's failure means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableAction {
    /// Transient: the table is retried after its backoff.
    Retry,
    /// The policy stops on it, for this table only: it is held (retried after its backoff,
    /// shown as failing) while the others go on.
    Hold,
    /// The stage stops.
    StopTheStage,
}

/// The per-table policy: [`policy`] on the class, with the stage's [`OperatorErrors`].
pub fn table_policy(class: ErrorClass, operator_errors: OperatorErrors) -> TableAction {
    match policy(class) {
        Action::Retry => TableAction::Retry,
        Action::Stop
            if class == ErrorClass::Operator && operator_errors == OperatorErrors::StopTheStage =>
        {
            TableAction::StopTheStage
        }
        Action::Stop => TableAction::Hold,
    }
}

/// What the stage does after one table failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableNext {
    /// The table waits this long; the other tables go on.
    RetryIn(Duration),
    /// The stage stops with the error (the caller returns it to its supervisor).
    StopTheStage,
}

/// A failing table: its backoff, and until when it waits.
struct Failing {
    /// The name the stage's status shows (Bronze keys its tables by topic).
    table: String,
    backoff: Backoff,
    /// `Some` while waiting (or, for a stage that resumes tables itself, until
    /// [`TableRetries::resume_due`] took it); `None` once resumed and not yet ok again.
    until: Option<Instant>,
}

/// The failing tables of one stage, each with its own backoff.
pub struct TableRetries {
    operator_errors: OperatorErrors,
    failing: HashMap<String, Failing>,
}

impl TableRetries {
    pub fn new(operator_errors: OperatorErrors) -> Self {
        TableRetries {
            operator_errors,
            failing: HashMap::new(),
        }
    }

    /// One table's work failed (`key` identifies it to the stage, `table` is the name its
    /// status shows): decides with [`table_policy`], shows the table in the stage's
    /// status, and starts or lengthens its wait.
    pub fn failed(
        &mut self,
        supervisor: &Supervisor,
        key: &str,
        table: &str,
        error: &dyn StageError,
    ) -> TableNext {
        if table_policy(error.class(), self.operator_errors) == TableAction::StopTheStage {
            return TableNext::StopTheStage;
        }
        supervisor.table_failed(table, error);
        let f = self.failing.entry(key.to_owned()).or_insert(Failing {
            table: table.to_owned(),
            backoff: Backoff::standard(),
            until: None,
        });
        let wait = f.backoff.next_wait();
        f.until = Some(Instant::now() + wait);
        TableNext::RetryIn(wait)
    }

    /// The table's work succeeded: it leaves the failing tables. True when it was failing.
    pub fn succeeded(&mut self, supervisor: &Supervisor, key: &str) -> bool {
        match self.failing.remove(key) {
            Some(f) => {
                supervisor.table_ok(&f.table);
                true
            }
            None => false,
        }
    }

    /// The table's wait is not over.
    pub fn waiting(&self, key: &str) -> bool {
        self.failing
            .get(key)
            .and_then(|f| f.until)
            .is_some_and(|u| u > Instant::now())
    }

    /// The table is paused until [`Self::resume_due`] takes it (for a stage that must do
    /// something to resume a table, as Bronze re-reads it from its offsets).
    pub fn paused(&self, key: &str) -> bool {
        self.failing.get(key).is_some_and(|f| f.until.is_some())
    }

    /// When the next paused table's wait ends.
    pub fn next_resume(&self) -> Option<Instant> {
        self.failing.values().filter_map(|f| f.until).min()
    }

    /// The paused tables whose wait is over, no longer paused (they stay failing, with
    /// their backoff, until [`Self::succeeded`]).
    pub fn resume_due(&mut self) -> Vec<String> {
        let now = Instant::now();
        self.failing
            .iter_mut()
            .filter(|(_, f)| f.until.is_some_and(|u| u <= now))
            .map(|(key, f)| {
                f.until = None;
                key.clone()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Display;

    use super::*;
    use crate::cli::Stage;
    use crate::supervisor::Stages;

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
    }

    #[test]
    fn only_an_operator_error_of_a_shared_resource_stops_the_stage() {
        use ErrorClass::*;
        use OperatorErrors::*;
        assert_eq!(table_policy(Transient, StopTheStage), TableAction::Retry);
        assert_eq!(table_policy(Transient, HoldTheTable), TableAction::Retry);
        assert_eq!(
            table_policy(Operator, StopTheStage),
            TableAction::StopTheStage
        );
        assert_eq!(table_policy(Operator, HoldTheTable), TableAction::Hold);
        assert_eq!(table_policy(Record, StopTheStage), TableAction::Hold);
        assert_eq!(table_policy(Record, HoldTheTable), TableAction::Hold);
    }

    #[tokio::test]
    async fn a_failing_table_waits_is_shown_and_clears_on_success() {
        let stages = Stages::new(&[Stage::Silver]);
        let sup = Supervisor::new(Stage::Silver, &stages);
        let mut retries = TableRetries::new(OperatorErrors::HoldTheTable);
        let next = retries.failed(&sup, "s.t", "s.t", &E(ErrorClass::Operator));
        assert!(matches!(next, TableNext::RetryIn(w) if w <= Duration::from_millis(500)));
        assert!(retries.waiting("s.t") && retries.paused("s.t"));
        assert!(!retries.waiting("s.other"));
        let failing = stages.get(Stage::Silver).unwrap().failing_tables;
        assert_eq!(failing["s.t"].0, 1);
        assert!(retries.succeeded(&sup, "s.t"));
        assert!(!retries.succeeded(&sup, "s.t"));
        assert!(stages.get(Stage::Silver).unwrap().failing_tables.is_empty());
    }

    #[tokio::test]
    async fn bronze_stops_on_an_operator_error_and_resumes_a_table_once() {
        let stages = Stages::new(&[Stage::Bronze]);
        let sup = Supervisor::new(Stage::Bronze, &stages);
        let mut retries = TableRetries::new(OperatorErrors::StopTheStage);
        assert_eq!(
            retries.failed(&sup, "p.s.t", "s.t", &E(ErrorClass::Operator)),
            TableNext::StopTheStage
        );
        assert!(stages.get(Stage::Bronze).unwrap().failing_tables.is_empty());
        let TableNext::RetryIn(wait) =
            retries.failed(&sup, "p.s.t", "s.t", &E(ErrorClass::Transient))
        else {
            panic!("a transient failure is retried")
        };
        assert!(retries.resume_due().is_empty());
        tokio::time::sleep(wait).await;
        assert_eq!(retries.resume_due(), vec!["p.s.t".to_owned()]);
        assert!(!retries.paused("p.s.t") && retries.resume_due().is_empty());
        // Failing (under its table's name) until it succeeds.
        assert!(stages
            .get(Stage::Bronze)
            .unwrap()
            .failing_tables
            .contains_key("s.t"));
        assert!(retries.succeeded(&sup, "p.s.t"));
    }
}
