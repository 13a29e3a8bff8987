//! `analyze_email_content`: classification, sentiment, urgency and confidence of an
//! email (by id) or a text, asked of a model through the model port. Its result
//! carries top-level `classification` and `confidence`, so it classifies the run:
//! the approval policy reads them (by default, every side effect of a run
//! classified `complaint`, or with confidence below 0.8, waits for a human).
//!
//! When the model's reply is not a usable analysis (the built-in offline model
//! never gives one) or the model fails, the tool answers with a deterministic
//! keyword-rule estimate instead, and says so (`method: "rules"`, a `note`). The
//! rules never claim more than 0.9 confidence.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Value, json};
use troupe_actors::llm::{ChatRequest, Message, ModelChunk, ModelClient, Role, ToolChoice};
use troupe_actors::metrics;
use troupe_actors::protocol::Usage;
use troupe_actors::tool::{Tool, ToolContext, ToolError, ToolOutput};

use crate::email::mailbox::Mailboxes;
use crate::email::tools::{email_by_id, fragment};

/// The classes an email can be given.
pub const CLASSIFICATIONS: [&str; 10] = [
    "complaint",
    "delivery",
    "order",
    "meeting_request",
    "follow_up",
    "invoice",
    "newsletter",
    "spam",
    "personal",
    "other",
];

/// Characters of the email the model is shown.
const MAX_PROMPT_CHARS: usize = 8000;

const SYSTEM_PROMPT: &str = "You classify emails. Answer with one JSON object and nothing else: \
{\"classification\": one of complaint, delivery, order, meeting_request, follow_up, invoice, newsletter, spam, \
personal, other; \"sentiment\": positive, neutral or negative; \"urgency\": low, medium or high; \
\"confidence\": your confidence in the classification, 0 to 1; \"summary\": one sentence; \
\"requested_action\": what the sender wants, or null}.";

/// The tool.
pub struct AnalyzeEmailContent {
    /// Every tenant's mailbox, for emails given by id.
    pub mailboxes: Arc<Mailboxes>,
    /// The model asked.
    pub model: Arc<dyn ModelClient>,
}

#[async_trait]
impl Tool for AnalyzeEmailContent {
    fn name(&self) -> &str {
        "analyze_email_content"
    }

    fn description(&self) -> &str {
        "Classifies an email (by id) or a text: classification, sentiment, urgency, confidence, a one-line summary \
         and the action requested. The result classifies the run: complaints and low confidence send side \
         effects to a human."
    }

    fn parameters(&self) -> Value {
        crate::tools::schema_of::<super::tools::EmailOrText>()
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn describe_start(&self, args: &Value) -> String {
        match args.get("email_id").and_then(Value::as_str) {
            Some(id) => format!("Analysing {id}"),
            None => "Analysing a text".to_owned(),
        }
    }

    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let args: super::tools::EmailOrText = crate::tools::parse_args(args)?;
        let email_id = args.email_id.as_deref().map(str::trim).filter(|id| !id.is_empty());
        let (text, folder, email) = match (email_id, args.text.as_deref()) {
            (Some(id), None) => {
                let email = email_by_id(&self.mailboxes, &context.tenant, id).await?;
                let text =
                    format!("From: {}\nTo: {}\nSubject: {}\n\n{}", email.from, email.to, email.subject, email.body);
                (text, email.folder.clone(), Some(email))
            }
            (None, Some(text)) if !text.trim().is_empty() => (text.to_owned(), String::new(), None),
            _ => return Err(ToolError::InvalidArgs("give exactly one of email_id and a non-empty text".to_owned())),
        };
        // The mail system's own filter already judged an email filed as spam; a
        // small model that reads "your parcel" and says delivery does not overrule it.
        let mut usage = Usage::default();
        let mut analysis = if folder == "spam" {
            filed_as_spam(email.as_ref())
        } else {
            match self.ask_model(&text, &mut usage).await {
                Ok(analysis) => analysis,
                Err(why) => {
                    let mut estimate = rules(&text, &folder);
                    estimate["note"] = json!(format!("{why}; this is the rule-based estimate"));
                    estimate
                }
            }
        };
        analysis["model"] = json!(self.model.name());
        if let Some(email) = &email {
            analysis["email_id"] = json!(email.id);
        }
        // The model's call is charged to the run, usable reply or not.
        Ok(ToolOutput { value: analysis, fragments: email.iter().map(fragment).collect(), usage })
    }
}

impl AnalyzeEmailContent {
    /// The model's analysis, or why there is none; what the call spent goes to `spent`.
    async fn ask_model(&self, text: &str, spent: &mut Usage) -> Result<Value, String> {
        let shown: String = text.chars().take(MAX_PROMPT_CHARS).collect();
        let request = ChatRequest {
            messages: vec![Message::text(Role::System, SYSTEM_PROMPT), Message::text(Role::User, shown)],
            tools: Vec::new(),
            tool_choice: ToolChoice::None,
            max_tokens: Some(400),
            temperature: Some(0.0),
        };
        let mut stream = self.model.chat(request).await.map_err(|error| format!("the model failed: {error}"))?;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(ModelChunk::Done(reply)) => {
                    *spent = reply.usage;
                    metrics::model_usage(
                        self.model.model_id(),
                        reply.usage.input_tokens,
                        reply.usage.output_tokens,
                        reply.usage.cost_usd,
                    );
                    return parse_analysis(&reply.content)
                        .ok_or_else(|| "the model's reply was not a usable analysis".to_owned());
                }
                Ok(ModelChunk::Delta(_)) => {}
                Err(error) => return Err(format!("the model failed: {error}")),
            }
        }
        Err("the model's reply ended early".to_owned())
    }
}

/// The analysis of an email that the mail system filed as spam.
fn filed_as_spam(email: Option<&crate::email::mailbox::Email>) -> Value {
    json!({
        "classification": "spam",
        "confidence": 0.95,
        "sentiment": "neutral",
        "urgency": "low",
        "summary": format!("filed as spam: {}", email.map(|email| email.subject.as_str()).unwrap_or_default()),
        "requested_action": Value::Null,
        "method": "folder",
    })
}

/// The analysis in a model's reply: the outermost JSON object of the text, with a
/// known classification and a confidence between 0 and 1.
pub fn parse_analysis(reply: &str) -> Option<Value> {
    let start = reply.find('{')?;
    let end = reply.rfind('}')?;
    let value: Value = serde_json::from_str(reply.get(start..=end)?).ok()?;
    let classification = value.get("classification")?.as_str()?.trim().to_lowercase().replace([' ', '-'], "_");
    let confidence = value.get("confidence")?.as_f64().filter(|c| (0.0..=1.0).contains(c))?;
    if !CLASSIFICATIONS.contains(&classification.as_str()) {
        return None;
    }
    let pick = |key: &str, allowed: &[&str], default: &str| {
        let given = value.get(key).and_then(Value::as_str).map(str::to_lowercase);
        given.filter(|given| allowed.contains(&given.as_str())).unwrap_or_else(|| default.to_owned())
    };
    Some(json!({
        "classification": classification,
        "confidence": confidence,
        "sentiment": pick("sentiment", &["positive", "neutral", "negative"], "neutral"),
        "urgency": pick("urgency", &["low", "medium", "high"], "medium"),
        "summary": value.get("summary").and_then(Value::as_str).unwrap_or_default(),
        "requested_action": value.get("requested_action").cloned().unwrap_or(Value::Null),
        "method": "model",
    }))
}

/// Keywords (lowercase) that point to each classification.
const CUES: &[(&str, &[&str])] = &[
    (
        "spam",
        &[
            "you have been selected",
            "winner",
            "claim your",
            "gift card",
            "customs fee",
            "unpaid",
            "within 24 hours",
            "click here",
            "verify your account",
        ],
    ),
    (
        "complaint",
        &[
            "refund",
            "broken",
            "disappointed",
            "disappointing",
            "unacceptable",
            "complaint",
            "dispute",
            "damaged",
            "not working",
            "second time",
            "wasted",
        ],
    ),
    (
        "delivery",
        &[
            "tracking",
            "shipped",
            "out for delivery",
            "delivered",
            "on its way",
            "estimated delivery",
            "arriving",
            "carrier",
        ],
    ),
    (
        "order",
        &[
            "order confirmation",
            "thank you for your order",
            "thanks for shopping",
            "order total",
            "order number",
            "receipt",
        ],
    ),
    ("meeting_request", &["could we meet", "meeting", "calendar", "schedule", "agenda", "meeting room", "invite"]),
    ("follow_up", &["following up", "follow up", "just checking", "reminder", "any update"]),
    ("invoice", &["invoice", "amount due", "billing", "payment due", "charged automatically"]),
    ("newsletter", &["unsubscribe", "read online", "newsletter", "this week:"]),
];

const NEGATIVE: &[&str] =
    &["disappoint", "broken", "wasted", "angry", "unacceptable", "refund", "dispute", "terrible", "worst", "cracked"];
const POSITIVE: &[&str] = &["thank", "great", "good news", "happy", "love", "glad", "congratulations"];
const URGENT: &[&str] =
    &["urgent", "asap", "immediately", "within 24 hours", "within 48 hours", "dispute", "action required"];
const SOON: &[&str] = &["deadline", "confirm", "by friday", "soon", "today", "due"];

/// The rule-based estimate: keyword cues, counted.
pub fn rules(text: &str, folder: &str) -> Value {
    let lower = text.to_lowercase();
    let count = |cues: &[&str]| cues.iter().filter(|cue| lower.contains(*cue)).count();
    let mut scores: Vec<(&str, usize)> = CUES.iter().map(|(label, cues)| (*label, count(cues))).collect();
    if folder == "spam" {
        scores.iter_mut().filter(|(label, _)| *label == "spam").for_each(|(_, score)| *score += 5);
    }
    // Stable: on a tie the earlier class in CUES wins.
    scores.sort_by_key(|(_, score)| std::cmp::Reverse(*score));
    let (best, top) = scores[0];
    let second = scores[1].1;
    let (classification, confidence) =
        if top == 0 { ("other", 0.4) } else { (best, (0.5 + 0.1 * top as f64 - 0.1 * second as f64).clamp(0.4, 0.9)) };
    let sentiment = match count(NEGATIVE).cmp(&count(POSITIVE)) {
        std::cmp::Ordering::Greater => "negative",
        std::cmp::Ordering::Less => "positive",
        std::cmp::Ordering::Equal => "neutral",
    };
    let urgency = if count(URGENT) > 0 {
        "high"
    } else if count(SOON) > 0 {
        "medium"
    } else {
        "low"
    };
    json!({
        "classification": classification,
        "confidence": (confidence * 100.0_f64).round() / 100.0,
        "sentiment": sentiment,
        "urgency": urgency,
        "summary": lower.lines().find(|line| line.starts_with("subject:")).map_or("", |line| line[8..].trim()),
        "requested_action": Value::Null,
        "method": "rules",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_reply_is_read_from_its_json_object() {
        let reply = "Sure! {\"classification\": \"Meeting request\", \"confidence\": 0.92, \"sentiment\": \"positive\", \
            \"urgency\": \"medium\", \"summary\": \"Priya asks to meet.\"} Hope that helps.";
        let analysis = parse_analysis(reply).unwrap();
        assert_eq!(analysis["classification"], "meeting_request");
        assert_eq!(analysis["confidence"], 0.92);
        assert_eq!(analysis["method"], "model");
        assert_eq!(parse_analysis("{\"classification\": \"weird\", \"confidence\": 0.9}"), None);
        assert_eq!(parse_analysis("{\"classification\": \"spam\", \"confidence\": 7}"), None);
        assert_eq!(parse_analysis("no json here"), None);
    }

    #[test]
    fn the_rules_recognise_a_complaint_spam_and_a_delivery() {
        let complaint = rules(
            "Subject: Second broken lamp - I want a refund\n\nThe replacement arrived broken too. Really \
             disappointing. I will dispute the charge within 48 hours.",
            "inbox",
        );
        assert_eq!(complaint["classification"], "complaint");
        assert_eq!(complaint["sentiment"], "negative");
        assert_eq!(complaint["urgency"], "high");
        assert!(complaint["confidence"].as_f64().unwrap() >= 0.8, "{complaint}");
        assert_eq!(rules("Subject: hello\n\nanything", "spam")["classification"], "spam");
        let shipped = rules("Your order has shipped. Tracking number 1Z. Estimated delivery: today.", "inbox");
        assert_eq!(shipped["classification"], "delivery");
        let nothing = rules("Subject: hi\n\nsee you", "inbox");
        assert_eq!((nothing["classification"].as_str(), nothing["confidence"].as_f64()), (Some("other"), Some(0.4)));
    }
}
