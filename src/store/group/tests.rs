//! Planning a group in memory: merging jobs, refusals, the rows a group writes.
#![allow(clippy::unwrap_used)]

use chrono::Utc;
use serde_json::json;
use troupe_actors::protocol::{CallStatus, EventKind, Limits, ToolCall, ToolExecutionRecord};

use super::*;
use crate::store::encode::event_batch;

fn event(run_id: RunId, seq: u64) -> RunEvent {
    RunEvent { run_id, seq, ts: Utc::now(), parent_run_id: None, kind: EventKind::TurnStart { turn: 1 } }
}

fn record(run_id: RunId) -> RunRecord {
    RunRecord::accepted(run_id, "t".into(), "a".into(), "i".into(), Limits::default(), Utc::now())
}

fn call(run_id: RunId, status: CallStatus) -> StoreWrite {
    let call = ToolCall { call_id: "c".into(), name: "echo".into(), args: json!({}) };
    let mut record = ToolExecutionRecord::started(run_id, "a", "local".into(), 1, &call);
    record.status = status;
    StoreWrite::ToolExecution(record)
}

fn commit(run_id: RunId, seqs: std::ops::RangeInclusive<u64>, writes: Vec<StoreWrite>) -> Job {
    Job::commit(&Commit { run_id, writes, events: seqs.map(|seq| event(run_id, seq)).collect() }).unwrap()
}

#[test]
fn a_refused_commit_fails_alone_and_adds_no_row() {
    let (created, ended, missing) = (RunId::new(), RunId::new(), RunId::new());
    let mut runs = Map::default();
    let Job::Create { state, .. } = Job::create(&record(ended), &[]).unwrap() else { unreachable!() };
    runs.insert(ended, Slot::read(RunState { key: 7, status: "failed".into(), ..state }));
    let jobs = vec![
        Job::create(&record(created), &[event(created, 1)]).unwrap(),
        Job::create(&record(ended), &[event(ended, 1)]).unwrap(),
        commit(created, 3..=3, vec![StoreWrite::FinalOutput("gap".into())]),
        commit(created, 2..=3, vec![call(created, CallStatus::Started)]),
        commit(ended, 1..=1, vec![]),
        commit(missing, 1..=1, vec![]),
        commit(created, 4..=4, vec![call(created, CallStatus::Completed)]),
    ];
    let mut next_key = 8;
    let (write, outcomes) = plan(&jobs, runs, &"now".into(), &mut next_key);
    assert_eq!(
        outcomes,
        vec![
            Ok(()),
            Err(StoreError::Exists(ended)),
            Err(StoreError::SeqConflict { run_id: created, expected: 2, got: 3 }),
            Ok(()),
            Err(StoreError::Terminal(ended)),
            Err(StoreError::NotFound(missing)),
            Ok(()),
        ]
    );
    // One row per accepted commit, holding its events.
    let batches: Vec<(i64, i64)> = write.events.iter().map(|row| (row.first, row.last)).collect();
    assert_eq!(batches, vec![(1, 1), (2, 3), (4, 4)]);
    assert!(write.updated.is_empty() && write.progressed.is_empty(), "the ended run is not written");
    let (_, _, state) = &write.created[0];
    assert_eq!((state.last_seq, state.final_output.clone()), (4, None));
    // The new run took the next key (the refused creation took none), and its
    // rows name it by that key.
    assert_eq!((state.key, next_key), (8, 9));
    assert!(write.events.iter().all(|row| row.progress.key == 8));
    // One row per call, with its last status and the number of its first record.
    assert_eq!(write.tool_executions.len(), 1);
    let row = &write.tool_executions[0];
    assert_eq!((row.0, row.3, row.5), (8, 1, "completed"));
}

/// A tool record, plan or review that a commit writes both as a row and inside
/// an event is serialized once; the event reads as if serialized on its own,
/// also where the event's value differs from the row's.
#[test]
fn values_written_as_rows_and_events_are_serialized_once_and_read_back_unchanged() {
    use troupe_actors::protocol::{Plan, Recommendation, Review, ReviewStatus, TaskStatus, TodoItem};
    let run_id = RunId::new();
    let StoreWrite::ToolExecution(record) = call(run_id, CallStatus::Completed) else { unreachable!() };
    let other =
        ToolExecutionRecord { status: CallStatus::Failed, error: Some("boom \"quoted\"".into()), ..record.clone() };
    let item = |id: &str| TodoItem {
        id: id.into(),
        content: format!("task {id} ✓"),
        status: TaskStatus::Pending,
        tools: Vec::new(),
        result: Some("done".into()),
        error: None,
    };
    let plan = Plan { version: 3, items: vec![item("1"), item("2")] };
    let review = Review {
        status: ReviewStatus::Ok,
        quality_score: 0.5,
        completeness: 1.0,
        relevance: 0.25,
        needs_more_data: false,
        gaps: vec!["a \"gap\"".into()],
        suggested_actions: vec![troupe_actors::protocol::SuggestedAction::about("echo", "call it again")],
        recommendation: Recommendation::Proceed,
        question: None,
        updated_plan: Some(vec![item("3")]),
        notes: "line\nbreak".into(),
        usage: Default::default(),
    };
    let kinds = vec![
        EventKind::ToolMetric { record: Box::new(record.clone()) },
        EventKind::ToolMetric { record: Box::new(other) },
        EventKind::PlanUpdated { plan: plan.clone() },
        EventKind::Review { turn: 12, review: Box::new(review.clone()) },
        EventKind::Review { turn: 13, review: Box::new(review.clone()) },
    ];
    let events: Vec<RunEvent> = (1..)
        .zip(kinds)
        .map(|(seq, kind)| RunEvent { run_id, seq, ts: Utc::now(), parent_run_id: None, kind })
        .collect();
    let writes =
        vec![StoreWrite::ToolExecution(record), StoreWrite::Plan(plan), StoreWrite::Review { turn: 12, review }];
    let embedded: Vec<bool> = {
        let encoded: Vec<EncodedWrite> = writes.iter().map(encode_write).collect::<Result<_, _>>().unwrap();
        events.iter().map(|event| embedded(&event.kind, &writes, &encoded).is_some()).collect()
    };
    assert_eq!(embedded, vec![true, false, true, true, false], "only equal values are taken from the rows");
    let Job::Commit { events: Some(batch), .. } =
        Job::commit(&Commit { run_id, writes, events: events.clone() }).unwrap()
    else {
        unreachable!()
    };
    assert_eq!(&*batch.body, event_batch(&events, |_| None).unwrap(), "as serialized on its own");
    assert_eq!(crate::store::encode::read_batch(&batch.body, run_id).unwrap(), events);

    // A stream sends each event as its commit's text, with the run put back.
    crate::store::recent::remember(run_id, &events, &batch.body, &batch.spans);
    for event in &events {
        let mut sent = Vec::new();
        assert!(crate::store::recent::write_json(&mut sent, event), "seq {} is kept", event.seq);
        assert_eq!(String::from_utf8(sent).unwrap(), serde_json::to_string(event).unwrap());
    }
    let later = RunEvent { seq: 6, ..events[0].clone() };
    assert!(!crate::store::recent::write_json(&mut Vec::new(), &later), "an event never committed");
}

/// A run whose status, reason or final output a job changed is written whole
/// (also when a later job of the group only progressed it); a run whose last
/// change had events is not written, its events' row holds its progress; the
/// others only with the columns a commit in flight changes.
#[test]
fn only_runs_whose_status_or_output_changed_are_written_whole() {
    use troupe_actors::protocol::{RunStatus, Usage};
    let [moved, answered, carried, quiet, untouched] =
        [RunId::new(), RunId::new(), RunId::new(), RunId::new(), RunId::new()];
    let mut runs = Map::default();
    for (key, run_id) in (1..).zip([moved, answered, carried, quiet, untouched]) {
        let Job::Create { state, .. } = Job::create(&record(run_id), &[]).unwrap() else { unreachable!() };
        runs.insert(run_id, Slot::read(RunState { key, ..state }));
    }
    let progress = || StoreWrite::Progress { turn: 2, usage: Usage::default() };
    let jobs = vec![
        commit(moved, 1..=1, vec![StoreWrite::Status { status: RunStatus::WaitingInput, reason: None }]),
        commit(moved, 2..=2, vec![progress()]),
        commit(answered, 1..=1, vec![StoreWrite::FinalOutput("answer".into())]),
        commit(carried, 1..=2, vec![progress(), call(carried, CallStatus::Started)]),
        commit(quiet, 1..=1, vec![]),
        Job::commit(&Commit { run_id: quiet, writes: vec![progress()], events: vec![] }).unwrap(),
    ];
    let (write, outcomes) = plan(&jobs, runs, &"now".into(), &mut 6);
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    let ids = |rows: &[(RunId, RunState)]| {
        let mut ids: Vec<RunId> = rows.iter().map(|(id, _)| *id).collect();
        ids.sort();
        ids
    };
    let mut whole = vec![moved, answered];
    whole.sort();
    assert_eq!(ids(&write.updated), whole);
    assert_eq!(ids(&write.progressed), vec![quiet], "its last commit had no events");
    assert_eq!(ids(&write.carried), vec![carried], "the untouched run is not written");
    let (_, state) = write.updated.iter().find(|(id, _)| *id == moved).unwrap();
    assert_eq!((&*state.status, state.turn, state.last_seq), ("waiting_input", 2, 2), "its final state");
    let (_, state) = &write.progressed[0];
    assert_eq!((state.turn, state.last_seq), (2, 1));
    // The carried run's progress is in the row of its events, as the commit left it.
    let row = write.events.iter().find(|row| row.progress.key == 3).unwrap();
    let progress = &row.progress;
    assert_eq!((row.first, row.last, progress.turn, progress.tool_count), (1, 2, 2, 1));
    assert_eq!(&*progress.updated_at, "now");
}
