//! The memory-retrieval evaluation (`starling eval memory`) on a toy file, with the real
//! embedding model (all-MiniLM-L6-v2).

#![allow(clippy::unwrap_used)]

use starling_eval::memory::{evaluate, EvalMemory, EvalQuery};
use starling_models::embed::{BertEmbedder, EmbedHandle};
use starling_models::testing;

fn embedder() -> EmbedHandle {
    EmbedHandle::spawn(BertEmbedder::load(testing::embedding_model()).unwrap()).unwrap()
}

#[tokio::test]
async fn eval_metrics_on_a_toy_file() {
    let e = embedder();
    let m = |id: &str, d: &str, p: &str| EvalMemory {
        id: id.into(),
        domain: d.into(),
        prompt: p.into(),
        answer: "answer".into(),
    };
    let memories = vec![
        m("cap-fr", "geo", "What is the capital of France?"),
        m("cap-jp", "geo", "What is the capital of Japan?"),
        m("cur-fr", "geo", "What currency is used in France?"),
        m("boil-egg", "cook", "How long should I boil an egg?"),
        m("roast-chk", "cook", "What temperature to roast a chicken?"),
    ];
    let q = |q: &str, d: &str, r: &str| EvalQuery {
        query: q.into(),
        domain: d.into(),
        relevant: vec![r.into()],
    };
    let queries = vec![
        q(
            "Which city is France's seat of government?",
            "geo",
            "cap-fr",
        ),
        q(
            "Which city is the seat of government of France?",
            "geo",
            "cap-fr",
        ),
        q("What money do people pay with in France?", "geo", "cur-fr"),
        q("What money is spent in France?", "geo", "cur-fr"),
        q("Minutes to cook eggs in boiling water", "cook", "boil-egg"),
        q("Oven heat for a whole chicken", "cook", "roast-chk"),
    ];
    let r = evaluate(&memories, &queries, Some(e), true).await.unwrap();
    assert_eq!(r.indexed, 5);
    assert_eq!(r.hybrid.queries, 6);
    assert!(r.hybrid.recall_at_3 >= 0.99, "{r:?}");
    assert!(r.hybrid.mrr >= r.bm25.mrr, "{r:?}");
    // The node's ranking is the last stage: the late-interaction re-ranking with the
    // neighbour term.
    let last = r.stages.last().unwrap();
    assert!(last.name.contains("late interaction"), "{}", last.name);
    assert!(last.name.contains("neighbours"), "{}", last.name);
    assert_eq!(last.metrics, r.hybrid);
    let f = r.feedback.unwrap();
    assert_eq!(f.train_queries, 3);
    assert_eq!(f.reports.0 + f.reports.1, 3 * 3 - 1);
    // Unknown ids are an error, not a silent zero.
    let bad = vec![q("x", "geo", "missing")];
    assert!(evaluate(&memories, &bad, None, false).await.is_err());
}
