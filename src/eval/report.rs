//! The results of an eval: one line per task, a summary, or JSON.

use std::io::Write;
use std::time::Duration;

use serde::Serialize;

use crate::eval::{Outcome, Task};

/// One task's result.
#[derive(Debug, Clone, Serialize)]
pub struct TaskResult {
    /// The task.
    pub name: String,
    /// Its agent.
    pub agent: String,
    /// The run (empty when it was never submitted).
    pub run_id: String,
    /// Whether the result is right.
    pub passed: bool,
    /// Why not.
    pub failures: Vec<String>,
    /// Where the run ended or parked.
    pub status: Option<String>,
    /// Turns started.
    pub turns: u32,
    /// Tokens spent.
    pub tokens: u64,
    /// Wall time from submission to the end (or the park), in seconds.
    pub wall_secs: f64,
    /// The final answer.
    pub answer: Option<String>,
    /// The tools called, in order.
    pub tools: Vec<String>,
}

impl TaskResult {
    /// The result of a run that ended (or not) as `outcome` says.
    pub fn new(task: &Task, run_id: String, outcome: Outcome, failures: Vec<String>, wall: Duration) -> Self {
        Self {
            name: task.name.clone(),
            agent: task.agent.clone(),
            run_id,
            passed: failures.is_empty(),
            failures,
            status: outcome.status.map(|status| status.as_str().to_owned()),
            turns: outcome.turns,
            tokens: outcome.tokens,
            wall_secs: wall.as_secs_f64(),
            answer: outcome.answer,
            tools: outcome.calls.into_iter().map(|call| format!("{}:{}", call.tool, call.status)).collect(),
        }
    }

    /// The result of a task whose run could not even start.
    pub fn not_run(task: &Task, why: String) -> Self {
        Self::new(task, String::new(), Outcome::default(), vec![why], Duration::ZERO)
    }

    /// One line: PASS or FAIL, the task, its figures, and why it failed.
    pub fn line(&self) -> String {
        let verdict = if self.passed { "PASS" } else { "FAIL" };
        let mut line = format!(
            "{verdict} {} ({}; {}; {} turns, {} tokens, {:.1} s)",
            self.name,
            self.agent,
            self.status.as_deref().unwrap_or("unfinished"),
            self.turns,
            self.tokens,
            self.wall_secs
        );
        for failure in &self.failures {
            line.push_str(&format!("\n     - {failure}"));
        }
        line
    }
}

/// An eval's results.
#[derive(Debug, Clone)]
pub struct Report {
    /// One per task, in order.
    pub results: Vec<TaskResult>,
    /// The whole eval's wall time.
    pub wall: Duration,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    passed: usize,
    failed: usize,
    pass_rate: f64,
    median_task_secs: f64,
    wall_secs: f64,
    tasks: &'a [TaskResult],
}

impl Report {
    /// Tasks that passed.
    pub fn passed(&self) -> usize {
        self.results.iter().filter(|result| result.passed).count()
    }

    /// Tasks that failed.
    pub fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }

    /// The share of tasks that passed (1 for none).
    pub fn pass_rate(&self) -> f64 {
        if self.results.is_empty() { 1.0 } else { self.passed() as f64 / self.results.len() as f64 }
    }

    /// The median wall time of a task, in seconds.
    pub fn median_task_secs(&self) -> f64 {
        let mut times: Vec<f64> = self.results.iter().map(|result| result.wall_secs).collect();
        times.sort_by(f64::total_cmp);
        match times.len() {
            0 => 0.0,
            n if n % 2 == 1 => times[n / 2],
            n => (times[n / 2 - 1] + times[n / 2]) / 2.0,
        }
    }

    /// The summary, ending with the line `N passed, M failed`.
    pub fn write_summary(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(
            out,
            "\n{} tasks in {:.0} s, median {:.1} s a task; pass rate {:.0} %",
            self.results.len(),
            self.wall.as_secs_f64(),
            self.median_task_secs(),
            100.0 * self.pass_rate()
        )?;
        writeln!(out, "{} passed, {} failed", self.passed(), self.failed())
    }

    /// The whole report as one JSON document.
    pub fn write_json(&self, out: &mut impl Write) -> std::io::Result<()> {
        let report = JsonReport {
            passed: self.passed(),
            failed: self.failed(),
            pass_rate: self.pass_rate(),
            median_task_secs: self.median_task_secs(),
            wall_secs: self.wall.as_secs_f64(),
            tasks: &self.results,
        };
        serde_json::to_writer_pretty(&mut *out, &report)?;
        writeln!(out)
    }
}
