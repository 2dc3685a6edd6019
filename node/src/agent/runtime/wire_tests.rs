//! Property tests of the agent protocol's JSON bodies (`docs/protocol.md` §2–4): every body
//! a node can send parses back to the same value, a field a newer node adds is ignored by the
//! RPC bodies (and refused by cards, which deny unknown fields), and the fields the protocol
//! marks "default" may be left out by an older sender.

use proptest::collection::vec;
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{
    LocateReply, LocateRequest, MessageNote, ProgressNote, SpeakRequest, TaskReply, TaskRequest,
};
use crate::agent::card::AgentCard;
use crate::agent::chat::{
    ChatState, Decision, DecisionType, MemberRef, Message, MessageType, Task, TaskMode, TaskSpec,
    TaskState,
};
use crate::agent::grounded::{Located, Slot, SubQuestion, Term, Unit};
use crate::config::AgentKind;

/// Any text, control characters, quotes, backslashes and non-BMP characters included.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "(?s).{0,12}",
        Just(String::new()),
        "[\"\\\\\u{0}\u{1f}\u{7f}\u{2028}\u{1f600}a]{1,6}",
    ]
}

fn opt_text() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(text())
}

/// Finite numbers: JSON has no NaN or infinity (serde_json writes them as `null`).
fn score() -> impl Strategy<Value = f32> {
    prop_oneof![
        0.0f32..=1.0,
        proptest::num::f32::NORMAL,
        Just(0.0),
        Just(-0.0)
    ]
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        proptest::num::f64::NORMAL.prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            vec((text(), inner), 0..4).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn member() -> impl Strategy<Value = MemberRef> {
    (text(), text()).prop_map(|(id, name)| MemberRef { id, name })
}

fn decision_type() -> impl Strategy<Value = DecisionType> {
    prop_oneof![
        Just(DecisionType::Discuss),
        Just(DecisionType::AssignSync),
        Just(DecisionType::AssignAsync),
        Just(DecisionType::Pause),
        Just(DecisionType::Conclude),
    ]
}

fn chat_state() -> impl Strategy<Value = ChatState> {
    prop_oneof![
        Just(ChatState::Discussion),
        Just(ChatState::SyncTaskAssignment),
        Just(ChatState::AsyncTaskAssignment),
        Just(ChatState::PauseAndTrigger),
        Just(ChatState::Conclusion),
    ]
}

fn message_type() -> impl Strategy<Value = MessageType> {
    prop_oneof![
        Just(MessageType::Discuss),
        Just(MessageType::AssignSync),
        Just(MessageType::AssignAsync),
        Just(MessageType::Pause),
        Just(MessageType::Conclude),
        Just(MessageType::TaskReport),
        Just(MessageType::AutoPause),
        Just(MessageType::MemberLeft),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    (
        (text(), any::<u64>(), any::<u32>(), text(), chat_state()),
        (message_type(), text(), vec(text(), 0..3)),
        (opt_text(), opt_text(), opt_text(), opt_text(), opt_text()),
        vec(text(), 0..3),
    )
        .prop_map(
            |(
                (group_id, seq, turn, sender, state),
                (msg_type, content, next_speakers),
                (task_id, assignee, task_desc, task_abstract, task_conclusion),
                triggers,
            )| Message {
                group_id,
                seq,
                turn,
                sender,
                state,
                msg_type,
                content,
                next_speakers,
                task_id,
                assignee,
                task_desc,
                task_abstract,
                task_conclusion,
                triggers,
            },
        )
}

fn task() -> impl Strategy<Value = Task> {
    let mode = prop_oneof![Just(TaskMode::Sync), Just(TaskMode::Async)];
    let state = prop_oneof![
        Just(TaskState::Running),
        Just(TaskState::Done),
        Just(TaskState::Failed),
        Just(TaskState::Cancelled),
    ];
    (
        (text(), text(), text(), opt_text(), text()),
        (
            mode,
            state,
            any::<u32>(),
            any::<u64>(),
            opt_text(),
            opt_text(),
        ),
    )
        .prop_map(
            |(
                (id, assignee, assigner, task_abstract, desc),
                (mode, state, assigned_turn, deadline, result, child_group),
            )| Task {
                id,
                assignee,
                assigner,
                task_abstract,
                desc,
                mode,
                state,
                assigned_turn,
                deadline,
                result,
                child_group,
            },
        )
}

fn decision() -> impl Strategy<Value = Decision> {
    let spec =
        (text(), opt_text(), text()).prop_map(|(assignee, task_abstract, task_desc)| TaskSpec {
            assignee,
            task_abstract,
            task_desc,
        });
    (
        decision_type(),
        text(),
        vec(text(), 0..3),
        vec(spec, 0..3),
        vec(text(), 0..3),
    )
        .prop_map(
            |(msg_type, content, next_speakers, tasks, triggers)| Decision {
                msg_type,
                content,
                next_speakers,
                tasks,
                triggers,
            },
        )
}

fn sub_question() -> impl Strategy<Value = SubQuestion> {
    let slot = prop_oneof![
        Just(Slot::Person),
        Just(Slot::Time),
        Just(Slot::Date),
        Just(Slot::Quantity),
        Just(Slot::Count),
        Just(Slot::Place),
        Just(Slot::Thing),
    ];
    let term = (text(), score(), any::<bool>(), any::<bool>()).prop_map(
        |(term, weight, required, context)| Term {
            term,
            weight,
            required,
            context,
        },
    );
    (
        text(),
        slot,
        vec(text(), 0..3),
        vec(term, 0..4),
        any::<bool>(),
    )
        .prop_map(|(text, slot, slot_terms, terms, latest)| SubQuestion {
            text,
            slot,
            slot_terms,
            terms,
            latest,
        })
}

fn located() -> impl Strategy<Value = Located> {
    let unit = (
        text(),
        text(),
        text(),
        vec((text(), text()), 0..3),
        any::<u32>(),
        text(),
    )
        .prop_map(|(document, heading, text, fields, position, record)| Unit {
            document,
            heading,
            text,
            fields,
            position,
            record,
        });
    (unit, score(), opt_text(), any::<bool>()).prop_map(|(unit, score, span, pending)| Located {
        unit,
        score,
        span,
        pending,
    })
}

fn speak_request() -> impl Strategy<Value = SpeakRequest> {
    (
        (text(), text(), vec(member(), 0..4), vec(message(), 0..3)),
        (vec(task(), 0..3), any::<u32>(), any::<u32>()),
        (vec(decision_type(), 0..5), opt_text(), json()),
    )
        .prop_map(
            |(
                (group_id, goal, members, transcript),
                (tasks, turn, max_turns),
                (allowed, retry, schema),
            )| SpeakRequest {
                group_id,
                goal,
                members,
                transcript,
                tasks,
                turn,
                max_turns,
                allowed,
                retry,
                schema,
            },
        )
}

fn task_request() -> impl Strategy<Value = TaskRequest> {
    (
        text(),
        text(),
        task(),
        proptest::option::of(any::<u32>()),
        any::<u32>(),
        proptest::option::of(sub_question()),
    )
        .prop_map(
            |(group_id, goal, task, sub_team_depth, max_depth, grounded)| TaskRequest {
                group_id,
                goal,
                task,
                sub_team_depth,
                max_depth,
                grounded,
            },
        )
}

fn task_reply() -> impl Strategy<Value = TaskReply> {
    (
        any::<bool>(),
        text(),
        opt_text(),
        vec(located(), 0..3),
        opt_text(),
    )
        .prop_map(|(ok, result, child_group, evidence, agent)| TaskReply {
            ok,
            result,
            child_group,
            evidence,
            agent,
        })
}

fn message_note() -> impl Strategy<Value = MessageNote> {
    (text(), text(), message(), vec(member(), 0..4)).prop_map(
        |(goal, sender_name, message, members)| MessageNote {
            goal,
            sender_name,
            message,
            members,
        },
    )
}

fn card() -> impl Strategy<Value = AgentCard> {
    let kind = prop_oneof![Just(AgentKind::Tool), Just(AgentKind::Human)];
    (
        text(),
        text(),
        vec(text(), 0..3),
        kind,
        vec(text(), 0..3),
        vec(text(), 0..3),
        opt_text(),
    )
        .prop_map(
            |(name, description, skills, kind, tools, models, agent)| AgentCard {
                name,
                description,
                skills,
                kind,
                tools,
                models,
                agent,
            },
        )
}

/// The JSON object `value` is sent as.
fn object<T: Serialize>(value: &T) -> Map<String, Value> {
    match serde_json::to_value(value).unwrap() {
        Value::Object(map) => map,
        other => panic!("not sent as an object: {other}"),
    }
}

/// `value` as bytes on the wire and back.
fn round_trip<T: Serialize + DeserializeOwned>(value: &T) -> T {
    let bytes = serde_json::to_vec(value).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// `body` with a field a newer node might add, nested values included.
fn with_extra_field(mut body: Map<String, Value>, extra: Value) -> Value {
    body.insert("x_added_by_a_newer_node".into(), extra);
    Value::Object(body)
}

/// The optional string fields whose default is `""` (the others are `Option`s: `null`).
const EMPTY_STRING_DEFAULTS: &[&str] = &["heading", "record"];

/// `body` without each of `optional` whose value is the default (`null`, `[]`, `false`, `0`,
/// or `""` for [`EMPTY_STRING_DEFAULTS`]): what a sender that predates the field writes.
fn without_defaults(mut body: Map<String, Value>, optional: &[&str]) -> Value {
    for key in optional {
        let is_default = match body.get(*key) {
            Some(Value::Null) => true,
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::Bool(b)) => !b,
            Some(Value::String(s)) => s.is_empty() && EMPTY_STRING_DEFAULTS.contains(key),
            Some(Value::Number(n)) => n.as_u64() == Some(0),
            _ => false,
        };
        if is_default {
            body.remove(*key);
        }
    }
    Value::Object(body)
}

fn parse<T: DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn speak_requests_and_decisions_round_trip(req in speak_request(), d in decision(), extra in json()) {
        prop_assert_eq!(&round_trip(&req), &req);
        prop_assert_eq!(&parse::<SpeakRequest>(with_extra_field(object(&req), extra.clone())), &req);
        prop_assert_eq!(&round_trip(&d), &d);
        prop_assert_eq!(&parse::<Decision>(with_extra_field(object(&d), extra)), &d);
        prop_assert_eq!(
            &parse::<Decision>(without_defaults(object(&d), &["next_speakers", "tasks", "triggers"])),
            &d
        );
        for m in &req.transcript {
            let optional = ["next_speakers", "task_id", "assignee", "task_desc", "task_abstract", "task_conclusion", "triggers"];
            prop_assert_eq!(&parse::<Message>(without_defaults(object(m), &optional)), m);
        }
    }

    #[test]
    fn task_requests_and_replies_round_trip(req in task_request(), reply in task_reply(), extra in json()) {
        prop_assert_eq!(&round_trip(&req), &req);
        prop_assert_eq!(&parse::<TaskRequest>(with_extra_field(object(&req), extra.clone())), &req);
        prop_assert_eq!(&parse::<TaskRequest>(without_defaults(object(&req), &["grounded"])), &req);
        prop_assert_eq!(&round_trip(&reply), &reply);
        prop_assert_eq!(&parse::<TaskReply>(with_extra_field(object(&reply), extra)), &reply);
        // `agent` is left out when absent, so a reply without one reads as before.
        prop_assert_eq!(object(&reply).contains_key("agent"), reply.agent.is_some());
        prop_assert_eq!(&parse::<TaskReply>(without_defaults(object(&reply), &["evidence", "agent"])), &reply);
    }

    #[test]
    fn locate_requests_and_replies_round_trip(
        subs in vec(sub_question(), 0..4),
        hits in vec(vec(located(), 0..3), 0..3),
        extra in json(),
    ) {
        let req = LocateRequest { subs };
        prop_assert_eq!(&round_trip(&req), &req);
        prop_assert_eq!(&parse::<LocateRequest>(with_extra_field(object(&req), extra.clone())), &req);
        let reply = LocateReply { hits };
        prop_assert_eq!(&round_trip(&reply), &reply);
        prop_assert_eq!(&parse::<LocateReply>(with_extra_field(object(&reply), extra)), &reply);
        for l in reply.hits.iter().flatten() {
            prop_assert_eq!(&parse::<Located>(without_defaults(object(l), &["pending"])), l);
            let unit = without_defaults(object(&l.unit), &["heading", "fields", "position", "record"]);
            prop_assert_eq!(&parse::<Unit>(unit), &l.unit);
        }
        for s in &req.subs {
            for t in &s.terms {
                prop_assert_eq!(&parse::<Term>(without_defaults(object(t), &["context"])), t);
            }
        }
    }

    #[test]
    fn message_notes_round_trip(note in message_note(), extra in json()) {
        prop_assert_eq!(&round_trip(&note), &note);
        prop_assert_eq!(&parse::<MessageNote>(with_extra_field(object(&note), extra)), &note);
        // Notes from hosts that predate failover carry no member list.
        prop_assert_eq!(&parse::<MessageNote>(without_defaults(object(&note), &["members"])), &note);
    }

    #[test]
    fn progress_notes_round_trip(
        (group_id, task_id, agent, state, progress) in (text(), text(), text(), text(), opt_text()),
        extra in json(),
    ) {
        let note = ProgressNote { group_id, task_id, agent, state, progress };
        prop_assert_eq!(&round_trip(&note), &note);
        prop_assert_eq!(&parse::<ProgressNote>(with_extra_field(object(&note), extra)), &note);
        prop_assert_eq!(object(&note).contains_key("progress"), note.progress.is_some());
    }

    #[test]
    fn cards_round_trip_and_refuse_unknown_fields(card in card(), extra in json()) {
        prop_assert_eq!(&round_trip(&card), &card);
        prop_assert_eq!(object(&card).contains_key("agent"), card.agent.is_some());
        prop_assert_eq!(
            &parse::<AgentCard>(without_defaults(object(&card), &["skills", "tools", "models"])),
            &card
        );
        // Cards deny unknown fields (§5): a card with a field this node does not know is refused whole.
        prop_assert!(serde_json::from_value::<AgentCard>(with_extra_field(object(&card), extra)).is_err());
    }
}
