//! Texts for the model and for people: the speaker prompt of a chat turn, and the shown
//! forms of answers (findings, evidence, citations).

use super::*;

/// `examples`: worked examples from shared memories for the goal (see
/// [`format_examples`]), in the system message so that the prompt prefix stays the same for
/// every turn of the group.
pub(super) fn speak_prompt(agent: &Agent, req: &SpeakRequest, examples: &str) -> Vec<ChatMessage> {
    let me = &agent.0.me;
    let mut system = format!(
        "You are {}, a member of a team chat. About you: {}\n",
        agent.0.name, agent.0.config.agent.description
    );
    system.push_str("Team members (use these ids):\n");
    for m in &req.members {
        let about = agent
            .cards()
            .get(&m.id)
            .map(|c| c.card.description.clone())
            .unwrap_or_default();
        let you = if &m.id == me { " (you)" } else { "" };
        system.push_str(&format!("- {} = {}{}: {}\n", m.id, m.name, you, about));
    }
    system.push_str(
        "Reply with one JSON decision. Types: discuss (say something new), assign_sync / assign_async \
         (give members tasks that match their skills), pause (wait for tasks), conclude (final answer \
         with every fact found).",
    );
    if !examples.is_empty() {
        system.push('\n');
        system.push_str(examples);
    }
    let mut user = format!("Goal: {}\n", req.goal);
    if !req.tasks.is_empty() {
        user.push_str("Tasks:\n");
        for t in &req.tasks {
            let who = agent.name_of(&t.assignee);
            let res = t.result.as_deref().unwrap_or("");
            user.push_str(&format!(
                "- {} ({who}, {:?}): {} {}\n",
                t.id, t.state, t.desc, res
            ));
        }
    }
    if !req.transcript.is_empty() {
        user.push_str("Chat so far:\n");
        for m in &req.transcript {
            let who = agent.name_of(&m.sender);
            let text: String = m.content.chars().take(400).collect();
            user.push_str(&format!("{who}: {text}\n"));
        }
    }
    user.push_str(&format!("Turn {} of {}. ", req.turn, req.max_turns));
    if req.allowed == [DecisionType::Conclude] {
        user.push_str(
            "Conclude now: state the final answer with every fact from the task results.",
        );
    } else if req.allowed == [DecisionType::AssignSync] {
        user.push_str("Split the goal: give each member one task that matches its skills.");
    } else {
        user.push_str("Your decision:");
    }
    if let Some(r) = &req.retry {
        user.push_str(&format!("\nNote: {r}"));
    }
    vec![ChatMessage::system(system), ChatMessage::user(user)]
}

/// The conclusion as shown to the user: the concluding member's text, then what each
/// finished task found, with who found it (provenance).
pub fn with_findings(conclusion: &str, tasks: &[Task], name_of: impl Fn(&str) -> String) -> String {
    let done: Vec<&Task> = tasks
        .iter()
        .filter(|t| {
            t.state == TaskState::Done && t.result.as_deref().is_some_and(|r| !r.trim().is_empty())
        })
        .collect();
    if done.is_empty() {
        return conclusion.to_owned();
    }
    let mut s = conclusion.trim().to_owned();
    s.push_str("\n\nFindings:");
    for t in done {
        s.push_str(&format!(
            "\n- {} ({}): {}",
            t.task_abstract.as_deref().unwrap_or(&t.desc),
            name_of(&t.assignee),
            t.result.as_deref().unwrap_or("").trim()
        ));
    }
    s
}

/// A task's answer followed by the document passages it rests on, quoted (a small model's
/// answer may paraphrase a fact away; the quote keeps it, with where it came from).
pub fn with_evidence(answer: &str, steps: &[crate::agent::executor::StepTrace]) -> String {
    let mut quotes: Vec<&str> = Vec::new();
    for s in steps {
        if s.tool != "search_docs" || s.error.is_some() {
            continue;
        }
        if let Some(o) = s.observation.as_deref().map(str::trim) {
            if !o.is_empty() && !quotes.contains(&o) {
                quotes.push(o);
            }
        }
    }
    if quotes.is_empty() {
        return answer.trim().to_owned();
    }
    let mut out = answer.trim().to_owned();
    out.push_str("\nEvidence from my documents:");
    for q in quotes.iter().take(3) {
        let q: String = q.chars().take(600).collect();
        out.push_str("\n> ");
        out.push_str(&q.replace('\n', "\n> "));
    }
    out
}

/// The conclusion message of a grounded inquiry: the answer, then its sources.
pub fn answer_message(a: &Answer) -> String {
    let mut s = a.answer.clone();
    if !a.citations.is_empty() {
        s.push_str("\nSources:");
        for c in &a.citations {
            s.push_str(&format!("\n- {}", c.line()));
        }
    }
    s
}

/// The first `n` words of `text`.
pub(super) fn clip_words(text: &str, n: usize) -> String {
    text.split_whitespace()
        .take(n)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::executor::StepTrace;

    fn step(tool: &str, obs: &str, error: Option<&str>) -> StepTrace {
        StepTrace {
            step: "s".into(),
            tool: tool.into(),
            args: serde_json::json!({}),
            observation: Some(obs.into()),
            error: error.map(str::to_owned),
            grounded: true,
        }
    }

    #[test]
    fn evidence_quotes_document_passages_once() {
        let steps = vec![
            step("search_docs", "[a.md] Seeds germinate at 24 C.", None),
            step("search_docs", "[a.md] Seeds germinate at 24 C.", None),
            step("calculator", "4", None),
            step("search_docs", "[b.md] broken", Some("failed")),
        ];
        let r = with_evidence("Warm is best.", &steps);
        assert_eq!(r.matches("24 C").count(), 1, "{r}");
        assert!(r.starts_with("Warm is best."));
        assert!(!r.contains("broken") && !r.contains("\n> 4"));
        assert_eq!(with_evidence(" plain ", &[]), "plain");
    }

    #[test]
    fn findings_credit_each_finished_task() {
        let task = |id: &str, state, result: Option<&str>| Task {
            id: id.into(),
            assignee: format!("n-{id}"),
            assigner: "host".into(),
            task_abstract: Some(format!("about {id}")),
            desc: "d".into(),
            mode: crate::agent::chat::TaskMode::Sync,
            state,
            assigned_turn: 1,
            deadline: 0,
            result: result.map(str::to_owned),
            child_group: None,
        };
        let tasks = vec![
            task("t1", TaskState::Done, Some("Thursday")),
            task("t2", TaskState::Failed, Some("timeout")),
        ];
        let c = with_findings("Done.", &tasks, |id| id.to_uppercase());
        assert!(c.contains("about t1 (N-T1): Thursday"), "{c}");
        assert!(!c.contains("timeout"));
        assert_eq!(with_findings("Done.", &[], |i| i.to_owned()), "Done.");
    }
}
