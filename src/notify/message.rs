//! A notification as each kind of target receives it: Slack's
//! `{"text"}`, the webhook's JSON, an email's subject and plain text.
//! Pure: no IO.

use serde_json::{Value as Json, json};

use super::Condition;

/// One message, whatever the target.
#[derive(Debug, Clone)]
pub struct Message {
    pub condition: String,
    pub source: Option<String>,
    pub action: Option<String>,
    pub event_id: Option<String>,
    /// Occurrences this message stands for.
    pub count: i64,
    /// Unix seconds.
    pub at: i64,
    pub summary: String,
    pub details: Json,
    /// The inspector's address, when `ui_url` is set.
    pub link: Option<String>,
}

impl Message {
    /// The message for a stored row. A row collected over a coalescing
    /// window (due after it was created) says how many it stands for.
    pub fn of_row(t: &crate::store::notifications::Taken, ui_url: Option<&str>) -> Message {
        let blank = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let windowed = t.due_at > t.created_at;
        let summary = if windowed {
            let noun = t
                .condition
                .parse::<Condition>()
                .map_or("occurrences", Condition::plural);
            let at = if t.action.is_empty() {
                t.source.clone()
            } else {
                format!("{}/{}", t.source, t.action)
            };
            let on = if at.is_empty() {
                String::new()
            } else {
                format!(" on {at}")
            };
            format!("{} more {noun}{on} (latest: {})", t.count, t.summary)
        } else {
            t.summary.clone()
        };
        Message {
            condition: t.condition.clone(),
            source: blank(&t.source),
            action: blank(&t.action),
            event_id: t.event_id.clone(),
            count: t.count,
            at: t.created_at / 1000,
            summary,
            details: serde_json::from_str(&t.details).unwrap_or_else(|_| json!({})),
            link: ui_url.map(|u| format!("{u}/ui/")),
        }
    }

    /// What `notify test` sends.
    pub fn test(target: &str, now_ms: i64, ui_url: Option<&str>) -> Message {
        Message {
            condition: "test".to_string(),
            source: None,
            action: None,
            event_id: None,
            count: 1,
            at: now_ms / 1000,
            summary: format!("test message to {target}: notifications reach this target"),
            details: json!({}),
            link: ui_url.map(|u| format!("{u}/ui/")),
        }
    }

    /// The details as `key: value` lines (nulls left out).
    fn detail_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(obj) = self.details.as_object() {
            for (k, v) in obj {
                match v {
                    Json::Null => {}
                    Json::String(s) => lines.push(format!("{k}: {s}")),
                    other => lines.push(format!("{k}: {other}")),
                }
            }
        }
        lines
    }

    /// Slack's incoming webhook body.
    pub fn slack(&self) -> Json {
        let mut text = format!("[idemhook] {}", self.summary);
        for line in self.detail_lines() {
            text.push_str(&format!("\n• {line}"));
        }
        if let Some(link) = &self.link {
            text.push_str(&format!("\n<{link}|Open the inspector>"));
        }
        json!({ "text": text })
    }

    /// The generic webhook's body.
    pub fn webhook(&self) -> Json {
        let mut details = self.details.clone();
        if let (Some(obj), Some(link)) = (details.as_object_mut(), &self.link) {
            obj.insert("link".to_string(), json!(link));
        }
        json!({
            "type": format!("idemhook.{}", self.condition),
            "source": self.source,
            "action": self.action,
            "event_id": self.event_id,
            "count": self.count,
            "at": self.at,
            "summary": self.summary,
            "details": details,
        })
    }

    /// An email's subject and plain-text body.
    pub fn email(&self) -> (String, String) {
        let subject = format!("[idemhook] {}", one_line(&self.summary, 150));
        let mut body = format!("{}\n\n", self.summary);
        body.push_str(&format!("condition: {}\n", self.condition));
        if let Some(s) = &self.source {
            body.push_str(&format!("source: {s}\n"));
        }
        if let Some(a) = &self.action {
            body.push_str(&format!("action: {a}\n"));
        }
        if let Some(e) = &self.event_id {
            body.push_str(&format!("event_id: {e}\n"));
        }
        body.push_str(&format!("count: {}\n", self.count));
        for line in self.detail_lines() {
            body.push_str(&format!("{line}\n"));
        }
        if let Some(link) = &self.link {
            body.push_str(&format!("\nInspector: {link}\n"));
        }
        (subject, body)
    }
}

/// `s` on one line, at most `max` characters.
fn one_line(s: &str, max: usize) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::notifications::Taken;

    fn row(due_at: i64, count: i64) -> Taken {
        Taken {
            id: 1,
            notify: "ops".into(),
            condition: "dead_letter".into(),
            source: "stripe".into(),
            action: "notify-app".into(),
            event_id: Some("evt_1".into()),
            count,
            summary: "dead letter on stripe/notify-app".into(),
            details:
                r#"{"error_kind":"status","http_status":500,"error":"downstream answered 500"}"#
                    .into(),
            attempt: 1,
            due_at,
            created_at: 1_000_000,
        }
    }

    #[test]
    fn a_window_message_says_how_many_it_stands_for() {
        let m = Message::of_row(&row(1_300_000, 41), None);
        assert!(
            m.summary
                .starts_with("41 more dead letters on stripe/notify-app"),
            "{}",
            m.summary
        );
        let first = Message::of_row(&row(1_000_000, 1), Some("https://ui.example.com"));
        assert_eq!(first.summary, "dead letter on stripe/notify-app");
        let hook = first.webhook();
        assert_eq!(hook["type"], "idemhook.dead_letter");
        assert_eq!(hook["details"]["http_status"], 500);
        assert_eq!(hook["details"]["link"], "https://ui.example.com/ui/");
        assert!(
            first.slack()["text"]
                .as_str()
                .unwrap()
                .contains("http_status: 500")
        );
        assert!(first.email().0.starts_with("[idemhook] "));
    }
}
