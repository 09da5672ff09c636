//! The providers as data: one row per provider kind (every kind but the
//! generic `hmac`, `basic`, `token` and `none`), with
//! its signature rule, event id and type, tolerance, key retention,
//! handshake, batch shape and the sample `idemhook send` posts. Adding a
//! provider is a row here and its vectors in `tests/vectors/`; code is
//! needed only for what a row cannot say (`verify::code`). The reason
//! and the source of each value are in docs/configuration.md's table.

use crate::verify::rule::{
    Alg, Carrier, Family, Piece, SecretEncoding, SignedRule, TimeFormat, TimeFrom, Timestamp,
    Window,
};
use crate::verify::{Encoding, HmacAlgorithm, Scheme, code};

/// A verification request some providers send before (or instead of)
/// events; answered as the provider requires, never stored. One that is an
/// echo of a field or a constant answer is data ([`Echo`]); the others are
/// code (`http/hooks/providers.rs`, `send/handshake.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    None,
    /// Answered with a field of the request, or a constant, as data.
    Echo(Echo),
    Zoom,
    Twitch,
    Meta,
    Okta,
    Asana,
    Notion,
}

impl Handshake {
    /// Its name, for `check`.
    pub fn label(self) -> String {
        match self {
            Handshake::Echo(echo) => echo.name.to_owned(),
            other => format!("{other:?}"),
        }
    }
}

/// Where a handshake reads a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// A query parameter.
    Query(&'static str),
    /// A JSON string at a pointer in the body.
    Json(&'static str),
    /// A JSON integer at a pointer in the body, as decimal text.
    JsonInt(&'static str),
    Header(&'static str),
}

impl Field {
    /// The parameter's, pointer's or header's name.
    pub fn name(self) -> &'static str {
        match self {
            Field::Query(name) | Field::Json(name) | Field::JsonInt(name) | Field::Header(name) => {
                name
            }
        }
    }
}

/// What an [`Echo`] answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The text of this field, the challenge.
    Challenge(Field),
    /// Always `body`; `what` names it in the log.
    Fixed {
        what: &'static str,
        body: &'static str,
    },
}

/// A handshake that is an echo of a field or a constant answer: answered
/// 200 with the field's text or the constant, nothing stored. Adding one
/// is data in the provider's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Echo {
    /// The provider's name for it, for `check`, the log and `send`.
    pub name: &'static str,
    /// Only a request of one of these methods is one (none: any); `send`
    /// uses the first (none: POST).
    pub methods: &'static [&'static str],
    /// It is one when this field holds this text (a challenge then empty
    /// when absent); without, when the challenge field is there, or
    /// always for a constant answer.
    pub when: Option<(Field, &'static str)>,
    pub answer: Answer,
    /// Answered before the signature is checked: the provider signs the
    /// events, not this request.
    pub unsigned: bool,
    pub content_type: &'static str,
    /// `X-Content-Type-Options: nosniff` on the answer.
    pub nosniff: bool,
    /// Echoed as sent, unchecked (Slack's); else a challenge is refused
    /// when too long or holding control characters.
    pub as_sent: bool,
}

/// Where the events of a batch delivery are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchShape<'a> {
    /// The array of items ("" for a body that is an array).
    pub items: &'a str,
    /// Inside each item, where the event is ("" for the item itself).
    pub inner: &'a str,
    /// The provider's id of the delivery, when it has one.
    pub delivery_id: Option<&'a str>,
}

/// What a stored delivery is answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// idemhook's JSON.
    Json,
    /// Adyen's `[accepted]`.
    Accepted,
    /// Discord's deferred response, `{"type":5}`.
    DiscordDeferred,
}

/// One provider kind.
#[derive(Debug)]
pub struct Preset {
    pub name: &'static str,
    pub scheme: fn() -> Scheme,
    /// The key's parts (several: a derived key).
    pub key: &'static [&'static str],
    /// Used when the key's first part is missing (Graph's optional `id`).
    pub key_fallback: &'static [&'static str],
    /// The type's parts, joined by `.` (`resource_type` + `action`).
    pub event_type: &'static [&'static str],
    /// Hash parts (Mailgun re-signs each attempt: only `event-data`).
    pub hash: &'static [&'static str],
    /// Members left out of the payload hash (attempt counters).
    pub hash_without: &'static [&'static str],
    /// The hash an event claimed from the provider's API list (`catchup`)
    /// is stored under, over parts the list and a delivery share; empty
    /// when the kind's API is not listed. A delivery's own hash stays the
    /// cheap one; only a duplicate of such an event computes this.
    pub listed_hash: &'static [&'static str],
    /// The default tolerance, for kinds that sign a timestamp.
    pub tolerance_secs: Option<u64>,
    pub retention_days: u64,
    /// The documented retry horizon, for `check`'s retention warning.
    pub horizon: Option<(u64, &'static str)>,
    pub kept_headers: &'static [&'static str],
    pub handshake: Handshake,
    pub batch: Option<BatchShape<'static>>,
    pub ack: Ack,
    /// The sample `send` posts: `{id}`, `{type}` and `{now}` are replaced.
    /// Empty: idemhook's own JSON sample, with the id and type written
    /// where the key and type rules read them (header or body).
    pub sample: &'static str,
    pub content_type: &'static str,
    pub sample_type: &'static str,
}

const DAY: u64 = 86_400;
const HOUR: u64 = 3_600;

fn header(name: &str, prefix: &str) -> Carrier {
    Carrier::Header {
        name: name.to_owned(),
        prefix: prefix.to_owned(),
        list: None,
    }
}

fn rule(
    kind: &'static str,
    alg: Alg,
    encoding: Encoding,
    message: Vec<Piece>,
    carrier: Carrier,
    timestamp: Option<Timestamp>,
) -> Scheme {
    Scheme::Rule {
        kind,
        rule: Box::new(SignedRule {
            alg,
            encoding,
            message,
            carrier,
            timestamp,
            secret_encoding: SecretEncoding::Text,
            secret_nfkd: false,
            secret_prefixes: &[],
            escaped_body: false,
            require: Vec::new(),
            strict: false,
            summary: None,
        }),
    }
}

/// A rule worded for `check` as `summary`.
fn worded(scheme: Scheme, summary: &'static str) -> Scheme {
    match scheme {
        Scheme::Rule { kind, mut rule } => {
            rule.summary = Some(summary);
            Scheme::Rule { kind, rule }
        }
        other => other,
    }
}

/// A rule of the first kinds: parsed strictly (see
/// [`SignedRule::strict`]), worded for `check` as `summary`.
fn strict(scheme: Scheme, summary: &'static str) -> Scheme {
    match worded(scheme, summary) {
        Scheme::Rule { kind, mut rule } => {
            rule.strict = true;
            Scheme::Rule { kind, rule }
        }
        other => other,
    }
}

/// One header with a single timestamp and any number of signatures of it
/// and the body joined by `joiner` (Stripe's `t=,v1=`, Paddle's `ts=;h1=`).
fn stamped(
    kind: &'static str,
    name: &'static str,
    (separator, timestamp_key, signature_key): (char, &'static str, &'static str),
    joiner: &str,
    summary: &'static str,
) -> Scheme {
    strict(
        rule(
            kind,
            Alg::Hmac(S256),
            HEX,
            vec![
                Piece::Timestamp,
                Piece::Text(joiner.to_owned()),
                Piece::Body,
            ],
            Carrier::Stamped {
                name,
                separator,
                timestamp_key,
                signature_key,
            },
            ts_carrier(TimeFormat::Unix, Window::Both),
        ),
        summary,
    )
}

/// An HMAC of the body alone, in one header.
fn body_hmac(
    kind: &'static str,
    alg: HmacAlgorithm,
    encoding: Encoding,
    name: &str,
    prefix: &str,
) -> Scheme {
    rule(
        kind,
        Alg::Hmac(alg),
        encoding,
        vec![Piece::Body],
        header(name, prefix),
        None,
    )
}

fn ts_header(name: &str, format: TimeFormat, window: Window) -> Option<Timestamp> {
    Some(Timestamp {
        from: TimeFrom::Header(name.to_owned()),
        format,
        window,
    })
}

fn ts_carrier(format: TimeFormat, window: Window) -> Option<Timestamp> {
    Some(Timestamp {
        from: TimeFrom::Carrier,
        format,
        window,
    })
}

fn pairs(name: &str) -> Carrier {
    Carrier::Pairs {
        name: name.to_owned(),
        timestamp_key: "t".to_owned(),
        signature_key: "v1".to_owned(),
    }
}

fn dotted() -> Vec<Piece> {
    vec![Piece::Timestamp, Piece::Text(".".to_owned()), Piece::Body]
}

fn token(kind: &'static str, name: &str, prefix: &str, encoding: Encoding) -> Scheme {
    rule(
        kind,
        Alg::Token,
        encoding,
        Vec::new(),
        header(name, prefix),
        None,
    )
}

/// Standard Webhooks (and Svix, its origin): `webhook-id`,
/// `webhook-timestamp` and `webhook-signature`, or the same three as
/// `svix-*` (read when no `webhook-*` one is sent). The signed content is
/// `{id}.{timestamp}.{body}`; `v1,<base64>` entries are an HMAC-SHA256
/// keyed with a `whsec_` secret's base64 (a secret without the prefix is
/// base64 too), `v1a,<base64>` ones an Ed25519 signature checked with a
/// `whpk_<base64>` public key. Also what forward actions and
/// notifications sign with (`sign_secret`).
pub fn standard() -> Scheme {
    const FAMILIES: &[Family] = &[
        Family {
            id: "webhook-id",
            timestamp: "webhook-timestamp",
            signature: "webhook-signature",
        },
        Family {
            id: "svix-id",
            timestamp: "svix-timestamp",
            signature: "svix-signature",
        },
    ];
    let scheme = strict(
        rule(
            "standard",
            Alg::Hmac(S256),
            B64,
            vec![
                Piece::Header("webhook-id".to_owned()),
                Piece::Text(".".to_owned()),
                Piece::Timestamp,
                Piece::Text(".".to_owned()),
                Piece::Body,
            ],
            Carrier::Versioned {
                families: FAMILIES,
                versions: &[("v1", Alg::Hmac(S256)), ("v1a", Alg::Ed25519)],
            },
            ts_carrier(TimeFormat::Unix, Window::Both),
        ),
        "webhook-signature v1,: base64 HMAC-SHA256 (or v1a ed25519) of id.timestamp.body; timestamp within tolerance",
    );
    match scheme {
        Scheme::Rule { kind, mut rule } => {
            rule.secret_encoding = SecretEncoding::Base64;
            rule.secret_prefixes = &[("whsec_", Alg::Hmac(S256)), ("whpk_", Alg::Ed25519)];
            Scheme::Rule { kind, rule }
        }
        other => other,
    }
}

const S256: HmacAlgorithm = HmacAlgorithm::Sha256;
const S1: HmacAlgorithm = HmacAlgorithm::Sha1;
const HEX: Encoding = Encoding::Hex;
const B64: Encoding = Encoding::Base64;
const JSON: &str = "application/json";

const BASE: Preset = Preset {
    name: "",
    scheme: || Scheme::None,
    key: &["json:/id"],
    key_fallback: &[],
    event_type: &["json:/type"],
    hash: &[],
    hash_without: &[],
    listed_hash: &[],
    tolerance_secs: None,
    retention_days: 7,
    horizon: None,
    kept_headers: &[],
    handshake: Handshake::None,
    batch: None,
    ack: Ack::Json,
    sample: r#"{"id":"{id}","type":"{type}","created":{now}}"#,
    content_type: JSON,
    sample_type: "test.event",
};

pub static PRESETS: &[Preset] = &[
    Preset {
        name: "stripe",
        scheme: || {
            stamped(
                "stripe",
                "Stripe-Signature",
                (',', "t", "v1"),
                ".",
                "Stripe-Signature t=..,v1=..: hex HMAC-SHA256 of t.body; timestamp within tolerance",
            )
        },
        // The event's id, type and data, canonicalised: the same for a
        // delivery and for the event as the API lists it (which differ in
        // `pending_webhooks` and formatting), so an event claimed by
        // catch-up and delivered later is a duplicate. A delivery keeps
        // the whole body's hash: canonicalising `data` on every claim
        // cost half again the CPU of a request.
        listed_hash: &["json:/id", "json:/type", "json:/data"],
        tolerance_secs: Some(300),
        horizon: Some((3 * DAY, "Stripe retries for up to 3 days")),
        kept_headers: &["stripe-signature"],
        sample: "",
        sample_type: "charge.succeeded",
        ..BASE
    },
    Preset {
        name: "github",
        scheme: || {
            worded(
                body_hmac("github", S256, HEX, "X-Hub-Signature-256", "sha256="),
                "X-Hub-Signature-256 sha256=: hex HMAC-SHA256 of the body",
            )
        },
        key: &["header:X-GitHub-Delivery"],
        event_type: &["header:X-GitHub-Event"],
        // manual redelivery for 3 days (7 on Enterprise Server)
        retention_days: 14,
        horizon: Some((
            3 * DAY,
            "GitHub redelivers on request for 3 days (7 on Enterprise Server)",
        )),
        kept_headers: &[
            "x-github-delivery",
            "x-github-event",
            "x-github-hook-id",
            "x-hub-signature-256",
        ],
        sample: "",
        sample_type: "push",
        ..BASE
    },
    Preset {
        name: "shopify",
        scheme: || {
            strict(
                body_hmac("shopify", S256, B64, "X-Shopify-Hmac-Sha256", ""),
                "X-Shopify-Hmac-Sha256: base64 HMAC-SHA256 of the body",
            )
        },
        key: &["header:X-Shopify-Event-Id|header:X-Shopify-Webhook-Id"],
        event_type: &["header:X-Shopify-Topic"],
        horizon: Some((4 * HOUR, "Shopify retries 8 times over 4 hours")),
        kept_headers: &[
            "x-shopify-event-id",
            "x-shopify-webhook-id",
            "x-shopify-topic",
            "x-shopify-shop-domain",
            "x-shopify-hmac-sha256",
        ],
        sample: "",
        sample_type: "orders/create",
        ..BASE
    },
    Preset {
        name: "slack",
        scheme: || {
            strict(
                rule(
                    "slack",
                    Alg::Hmac(S256),
                    HEX,
                    vec![
                        Piece::Text("v0:".to_owned()),
                        Piece::Timestamp,
                        Piece::Text(":".to_owned()),
                        Piece::Body,
                    ],
                    header("X-Slack-Signature", "v0="),
                    ts_header("X-Slack-Request-Timestamp", TimeFormat::Unix, Window::Both),
                ),
                "X-Slack-Signature v0=: hex HMAC-SHA256 of v0:ts:body; X-Slack-Request-Timestamp within tolerance",
            )
        },
        key: &["json:/event_id"],
        event_type: &["json:/event/type|json:/type"],
        tolerance_secs: Some(300),
        horizon: Some((HOUR, "Slack retries 3 times within the hour")),
        kept_headers: &["x-slack-request-timestamp", "x-slack-signature"],
        handshake: Handshake::Echo(Echo {
            name: "Slack",
            methods: &[],
            when: Some((Field::Json("/type"), "url_verification")),
            answer: Answer::Challenge(Field::Json("/challenge")),
            unsigned: false,
            content_type: "text/plain; charset=utf-8",
            nosniff: false,
            as_sent: true,
        }),
        sample: "",
        sample_type: "message",
        ..BASE
    },
    Preset {
        name: "paddle",
        scheme: || {
            stamped(
                "paddle",
                "Paddle-Signature",
                (';', "ts", "h1"),
                ":",
                "Paddle-Signature ts=..;h1=..: hex HMAC-SHA256 of ts:body; timestamp within tolerance",
            )
        },
        key: &["json:/event_id"],
        event_type: &["json:/event_type"],
        tolerance_secs: Some(300),
        horizon: Some((3 * DAY, "Paddle retries for up to 3 days")),
        kept_headers: &["paddle-signature"],
        sample: "",
        sample_type: "transaction.completed",
        ..BASE
    },
    Preset {
        name: "linear",
        scheme: || {
            worded(
                rule(
                    "linear",
                    Alg::Hmac(S256),
                    HEX,
                    vec![Piece::Body],
                    header("Linear-Signature", ""),
                    Some(Timestamp {
                        from: TimeFrom::Member("webhookTimestamp".to_owned()),
                        format: TimeFormat::UnixMs,
                        window: Window::Both,
                    }),
                ),
                "Linear-Signature: hex HMAC-SHA256 of the body; webhookTimestamp within tolerance",
            )
        },
        key: &["header:Linear-Delivery"],
        event_type: &["header:Linear-Event"],
        tolerance_secs: Some(300),
        horizon: Some((DAY, "Linear retries a few times, backing off over hours")),
        kept_headers: &["linear-delivery", "linear-event", "linear-signature"],
        sample: "",
        sample_type: "Issue",
        ..BASE
    },
    Preset {
        name: "standard",
        scheme: standard,
        key: &["header:webhook-id|header:svix-id"],
        tolerance_secs: Some(300),
        horizon: Some((
            76 * HOUR,
            "Svix retries for about 28 hours, the Standard Webhooks example schedule for about 76",
        )),
        kept_headers: &[
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature",
            "svix-id",
            "svix-timestamp",
            "svix-signature",
        ],
        sample: "",
        sample_type: "invoice.paid",
        ..BASE
    },
    Preset {
        name: "twilio",
        scheme: || Scheme::Code(code::TWILIO),
        key: &["header:I-Twilio-Idempotency-Token"],
        event_type: &["form:MessageStatus|form:CallStatus"],
        horizon: Some((
            60,
            "Twilio retries only within the request's connection overrides (seconds)",
        )),
        kept_headers: &["x-twilio-signature", "i-twilio-idempotency-token"],
        sample: "MessageSid=SM{id}&MessageStatus={type}&AccountSid=AC0000&To=%2B15550001111",
        content_type: "application/x-www-form-urlencoded",
        sample_type: "delivered",
        ..BASE
    },
    Preset {
        name: "sendgrid",
        scheme: || {
            rule(
                "sendgrid",
                Alg::EcdsaP256,
                B64,
                vec![
                    Piece::Header("X-Twilio-Email-Event-Webhook-Timestamp".to_owned()),
                    Piece::Body,
                ],
                header("X-Twilio-Email-Event-Webhook-Signature", ""),
                ts_header(
                    "X-Twilio-Email-Event-Webhook-Timestamp",
                    TimeFormat::Unix,
                    Window::Both,
                ),
            )
        },
        key: &["json:/sg_event_id"],
        event_type: &["json:/event"],
        tolerance_secs: Some(300),
        horizon: Some((DAY, "SendGrid retries for up to 24 hours")),
        kept_headers: &[
            "x-twilio-email-event-webhook-signature",
            "x-twilio-email-event-webhook-timestamp",
        ],
        batch: Some(BatchShape {
            items: "",
            inner: "",
            delivery_id: None,
        }),
        sample: r#"[{"sg_event_id":"{id}","event":"{type}","email":"a@example.com","timestamp":{now}}]"#,
        sample_type: "delivered",
        ..BASE
    },
    Preset {
        name: "discord",
        scheme: || {
            rule(
                "discord",
                Alg::Ed25519,
                HEX,
                vec![
                    Piece::Header("X-Signature-Timestamp".to_owned()),
                    Piece::Body,
                ],
                header("X-Signature-Ed25519", ""),
                ts_header("X-Signature-Timestamp", TimeFormat::Unix, Window::Both),
            )
        },
        tolerance_secs: Some(300),
        kept_headers: &["x-signature-ed25519", "x-signature-timestamp"],
        // PING, signed as the events are.
        handshake: Handshake::Echo(Echo {
            name: "Discord",
            methods: &[],
            when: Some((Field::JsonInt("/type"), "1")),
            answer: Answer::Fixed {
                what: "PING",
                body: r#"{"type":1}"#,
            },
            unsigned: false,
            content_type: JSON,
            nosniff: false,
            as_sent: false,
        }),
        ack: Ack::DiscordDeferred,
        sample: r#"{"id":"{id}","type":{type},"application_id":"1","token":"t","data":{"name":"hello"}}"#,
        sample_type: "2",
        ..BASE
    },
    Preset {
        name: "square",
        scheme: || {
            rule(
                "square",
                Alg::Hmac(S256),
                B64,
                vec![Piece::Url, Piece::Body],
                header("x-square-hmacsha256-signature", ""),
                None,
            )
        },
        key: &["json:/event_id"],
        horizon: Some((DAY, "Square retries for up to 24 hours")),
        kept_headers: &["x-square-hmacsha256-signature"],
        sample: r#"{"merchant_id":"M1","type":"{type}","event_id":"{id}","created_at":"2026-01-01T00:00:00Z","data":{"type":"payment","id":"p1"}}"#,
        sample_type: "payment.updated",
        ..BASE
    },
    Preset {
        name: "hubspot",
        scheme: || Scheme::Code(code::HUBSPOT),
        key: &[
            "json:/eventId",
            "json:/subscriptionId",
            "json:/portalId",
            "json:/occurredAt",
        ],
        event_type: &["json:/subscriptionType"],
        hash_without: &["/attemptNumber"],
        tolerance_secs: Some(300),
        horizon: Some((DAY, "HubSpot retries up to 10 times over 24 hours")),
        kept_headers: &[
            "x-hubspot-signature-v3",
            "x-hubspot-request-timestamp",
            "x-hubspot-signature",
            "x-hubspot-signature-version",
        ],
        batch: Some(BatchShape {
            items: "",
            inner: "",
            delivery_id: None,
        }),
        sample: r#"[{"eventId":"{id}","subscriptionId":1,"portalId":62515,"occurredAt":{now}000,"subscriptionType":"{type}","attemptNumber":0,"objectId":123}]"#,
        sample_type: "contact.creation",
        ..BASE
    },
    Preset {
        name: "razorpay",
        scheme: || body_hmac("razorpay", S256, HEX, "X-Razorpay-Signature", ""),
        key: &["header:X-Razorpay-Event-Id"],
        event_type: &["json:/event"],
        horizon: Some((
            DAY,
            "Razorpay retries for 24 hours, then disables the webhook",
        )),
        kept_headers: &["x-razorpay-signature", "x-razorpay-event-id"],
        sample: r#"{"entity":"event","event":"{type}","payload":{},"created_at":{now}}"#,
        sample_type: "payment.captured",
        ..BASE
    },
    Preset {
        name: "adyen",
        scheme: || Scheme::Code(code::ADYEN),
        key: &["json:/pspReference", "json:/eventCode", "json:/success"],
        event_type: &["json:/eventCode"],
        retention_days: 45,
        horizon: Some((30 * DAY, "Adyen queues retries for up to 30 days")),
        batch: Some(BatchShape {
            items: "/notificationItems",
            inner: "/NotificationRequestItem",
            delivery_id: None,
        }),
        ack: Ack::Accepted,
        sample: r#"{"live":"false","notificationItems":[{"NotificationRequestItem":{"pspReference":"{id}","originalReference":"","merchantAccountCode":"Test","merchantReference":"order-1","amount":{"value":1000,"currency":"EUR"},"eventCode":"{type}","success":"true","eventDate":"2026-01-01T00:00:00+01:00","additionalData":{}}}]}"#,
        sample_type: "AUTHORISATION",
        ..BASE
    },
    Preset {
        name: "gocardless",
        scheme: || body_hmac("gocardless", S256, HEX, "Webhook-Signature", ""),
        event_type: &["json:/resource_type", "json:/action"],
        retention_days: 14,
        horizon: Some((
            7 * DAY,
            "GoCardless retries about 10 times over days, and on request",
        )),
        kept_headers: &["webhook-signature"],
        batch: Some(BatchShape {
            items: "/events",
            inner: "",
            delivery_id: Some("/meta/webhook_id"),
        }),
        sample: r#"{"events":[{"id":"{id}","created_at":"2026-01-01T00:00:00Z","resource_type":"payments","action":"{type}","links":{"payment":"PM1"}}],"meta":{"webhook_id":"WB{id}"}}"#,
        sample_type: "confirmed",
        ..BASE
    },
    Preset {
        name: "box",
        scheme: || {
            let mut scheme = rule(
                "box",
                Alg::Hmac(S256),
                B64,
                vec![
                    Piece::Body,
                    Piece::Header("box-delivery-timestamp".to_owned()),
                ],
                Carrier::AnyHeader(vec![
                    "box-signature-primary".to_owned(),
                    "box-signature-secondary".to_owned(),
                ]),
                ts_header(
                    "box-delivery-timestamp",
                    TimeFormat::Rfc3339,
                    Window::NoFuture,
                ),
            );
            if let Scheme::Rule { rule, .. } = &mut scheme {
                rule.escaped_body = true;
                rule.require = vec![
                    ("box-signature-version".to_owned(), "1".to_owned()),
                    (
                        "box-signature-algorithm".to_owned(),
                        "HmacSHA256".to_owned(),
                    ),
                ];
            }
            scheme
        },
        event_type: &["json:/trigger"],
        tolerance_secs: Some(600),
        kept_headers: &[
            "box-delivery-id",
            "box-delivery-timestamp",
            "box-signature-primary",
            "box-signature-secondary",
        ],
        sample: r#"{"type":"webhook_event","id":"{id}","trigger":"{type}","source":{"id":"1","type":"file"}}"#,
        sample_type: "FILE.UPLOADED",
        ..BASE
    },
    Preset {
        name: "mailgun",
        scheme: || {
            rule(
                "mailgun",
                Alg::Hmac(S256),
                HEX,
                vec![
                    Piece::Json("/signature/timestamp".to_owned()),
                    Piece::Json("/signature/token".to_owned()),
                ],
                Carrier::Json("/signature/signature".to_owned()),
                Some(Timestamp {
                    from: TimeFrom::Json("/signature/timestamp".to_owned()),
                    format: TimeFormat::Unix,
                    window: Window::Both,
                }),
            )
        },
        key: &["json:/event-data/id"],
        event_type: &["json:/event-data/event"],
        hash: &["json:/event-data"],
        tolerance_secs: Some(900),
        horizon: Some((8 * HOUR, "Mailgun retries for 8 hours")),
        sample: r#"{"signature":{"timestamp":"{now}","token":"tok{id}","signature":""},"event-data":{"id":"{id}","event":"{type}","timestamp":{now}}}"#,
        sample_type: "delivered",
        ..BASE
    },
    Preset {
        name: "gitlab",
        scheme: || token("gitlab", "X-Gitlab-Token", "", Encoding::Text),
        key: &["header:Idempotency-Key|header:X-Gitlab-Event-UUID"],
        event_type: &["header:X-Gitlab-Event"],
        retention_days: 14,
        horizon: Some((
            7 * DAY,
            "GitLab resends by hand from the hook's recent events",
        )),
        kept_headers: &[
            "idempotency-key",
            "x-gitlab-event-uuid",
            "x-gitlab-event",
            "x-gitlab-instance",
        ],
        sample: r#"{"object_kind":"push","ref":"refs/heads/main","checkout_sha":"{id}"}"#,
        sample_type: "Push Hook",
        ..BASE
    },
    Preset {
        name: "bitbucket",
        scheme: || body_hmac("bitbucket", S256, HEX, "X-Hub-Signature", "sha256="),
        key: &["header:X-Request-UUID|header:X-Request-Id"],
        event_type: &["header:X-Event-Key"],
        horizon: Some((HOUR, "Bitbucket retries twice on a 5xx")),
        kept_headers: &[
            "x-request-uuid",
            "x-request-id",
            "x-event-key",
            "x-hook-uuid",
            "x-hub-signature",
        ],
        sample: r#"{"push":{"changes":[]},"repository":{"full_name":"team/repo"}}"#,
        sample_type: "repo:push",
        ..BASE
    },
    Preset {
        name: "zoom",
        scheme: || {
            rule(
                "zoom",
                Alg::Hmac(S256),
                HEX,
                vec![
                    Piece::Text("v0:".to_owned()),
                    Piece::Header("x-zm-request-timestamp".to_owned()),
                    Piece::Text(":".to_owned()),
                    Piece::Body,
                ],
                header("x-zm-signature", "v0="),
                ts_header("x-zm-request-timestamp", TimeFormat::Unix, Window::Both),
            )
        },
        key: &["json:/event", "json:/event_ts", "json:/payload/account_id"],
        event_type: &["json:/event"],
        tolerance_secs: Some(300),
        horizon: Some((2 * HOUR, "Zoom retries 3 times, at 5, 20 and 60 minutes")),
        kept_headers: &[
            "x-zm-signature",
            "x-zm-request-timestamp",
            "x-zm-trackingid",
        ],
        handshake: Handshake::Zoom,
        sample: r#"{"event":"{type}","event_ts":{now}000,"payload":{"account_id":"{id}","object":{"id":1}}}"#,
        sample_type: "meeting.started",
        ..BASE
    },
    Preset {
        name: "meta",
        scheme: || body_hmac("meta", S256, HEX, "X-Hub-Signature-256", "sha256="),
        key: &["body:sha256"],
        event_type: &["json:/object"],
        retention_days: 14,
        horizon: Some((
            7 * DAY,
            "Meta retries with decreasing frequency for up to 7 days",
        )),
        kept_headers: &["x-hub-signature-256"],
        handshake: Handshake::Meta,
        sample: r#"{"object":"{type}","entry":[{"id":"{id}","time":{now},"changes":[{"field":"messages","value":{}}]}]}"#,
        sample_type: "whatsapp_business_account",
        ..BASE
    },
    Preset {
        name: "twitch",
        scheme: || {
            rule(
                "twitch",
                Alg::Hmac(S256),
                HEX,
                vec![
                    Piece::Header("Twitch-Eventsub-Message-Id".to_owned()),
                    Piece::Header("Twitch-Eventsub-Message-Timestamp".to_owned()),
                    Piece::Body,
                ],
                header("Twitch-Eventsub-Message-Signature", "sha256="),
                ts_header(
                    "Twitch-Eventsub-Message-Timestamp",
                    TimeFormat::Rfc3339,
                    Window::Both,
                ),
            )
        },
        key: &["header:Twitch-Eventsub-Message-Id"],
        event_type: &["header:Twitch-Eventsub-Subscription-Type"],
        tolerance_secs: Some(600),
        kept_headers: &[
            "twitch-eventsub-message-id",
            "twitch-eventsub-message-timestamp",
            "twitch-eventsub-message-type",
            "twitch-eventsub-subscription-type",
            "twitch-eventsub-message-signature",
        ],
        handshake: Handshake::Twitch,
        sample: r#"{"subscription":{"id":"sub1","type":"{type}","version":"1"},"event":{"broadcaster_user_id":"1"}}"#,
        sample_type: "channel.follow",
        ..BASE
    },
    Preset {
        name: "dropbox",
        scheme: || body_hmac("dropbox", S256, HEX, "X-Dropbox-Signature", ""),
        key: &["body:sha256"],
        event_type: &[],
        kept_headers: &["x-dropbox-signature"],
        handshake: Handshake::Echo(Echo {
            name: "Dropbox",
            methods: &["GET"],
            when: None,
            answer: Answer::Challenge(Field::Query("challenge")),
            unsigned: true,
            content_type: "text/plain",
            nosniff: true,
            as_sent: false,
        }),
        sample: r#"{"list_folder":{"accounts":["dbid:{id}"]},"delta":{"users":[1]}}"#,
        ..BASE
    },
    Preset {
        name: "intercom",
        scheme: || body_hmac("intercom", S1, HEX, "X-Hub-Signature", "sha1="),
        event_type: &["json:/topic"],
        hash_without: &[
            "/delivery_attempts",
            "/delivery_status",
            "/delivered_at",
            "/first_sent_at",
        ],
        kept_headers: &["x-hub-signature"],
        sample: r#"{"type":"notification_event","id":"{id}","topic":"{type}","delivery_attempts":1,"created_at":{now},"data":{"item":{}}}"#,
        sample_type: "conversation.user.created",
        ..BASE
    },
    Preset {
        name: "typeform",
        scheme: || body_hmac("typeform", S256, B64, "Typeform-Signature", "sha256="),
        key: &["json:/event_id"],
        event_type: &["json:/event_type"],
        kept_headers: &["typeform-signature"],
        sample: r#"{"event_id":"{id}","event_type":"{type}","form_response":{"form_id":"f1"}}"#,
        sample_type: "form_response",
        ..BASE
    },
    Preset {
        name: "calendly",
        scheme: || {
            rule(
                "calendly",
                Alg::Hmac(S256),
                HEX,
                dotted(),
                pairs("Calendly-Webhook-Signature"),
                ts_carrier(TimeFormat::Unix, Window::Both),
            )
        },
        key: &["json:/event", "json:/payload/uri"],
        event_type: &["json:/event"],
        tolerance_secs: Some(180),
        kept_headers: &["calendly-webhook-signature"],
        sample: r#"{"event":"{type}","created_at":"2026-01-01T00:00:00Z","payload":{"uri":"https://api.calendly.com/invitees/{id}"}}"#,
        sample_type: "invitee.created",
        ..BASE
    },
    Preset {
        name: "coinbase",
        scheme: || body_hmac("coinbase", S256, HEX, "X-CC-Webhook-Signature", ""),
        key: &["json:/event/id"],
        event_type: &["json:/event/type"],
        hash_without: &["/attempt_number", "/scheduled_for"],
        horizon: Some((3 * DAY, "Coinbase Commerce retries for up to 3 days")),
        kept_headers: &["x-cc-webhook-signature"],
        sample: r#"{"id":1,"scheduled_for":"2026-01-01T00:00:00Z","attempt_number":1,"event":{"id":"{id}","type":"{type}","data":{}}}"#,
        sample_type: "charge:confirmed",
        ..BASE
    },
    Preset {
        name: "lemonsqueezy",
        scheme: || body_hmac("lemonsqueezy", S256, HEX, "X-Signature", ""),
        key: &[
            "json:/meta/event_name",
            "json:/data/type",
            "json:/data/id",
            "json:/data/attributes/updated_at",
        ],
        event_type: &["header:X-Event-Name"],
        kept_headers: &["x-signature", "x-event-name"],
        sample: r#"{"meta":{"event_name":"{type}"},"data":{"type":"orders","id":"{id}","attributes":{"updated_at":"2026-01-01T00:00:00Z"}}}"#,
        sample_type: "order_created",
        ..BASE
    },
    Preset {
        name: "vercel",
        scheme: || body_hmac("vercel", S1, HEX, "x-vercel-signature", ""),
        kept_headers: &["x-vercel-signature"],
        sample_type: "deployment.succeeded",
        ..BASE
    },
    Preset {
        name: "sentry",
        scheme: || body_hmac("sentry", S256, HEX, "Sentry-Hook-Signature", ""),
        key: &["header:Request-ID"],
        event_type: &["header:Sentry-Hook-Resource", "json:/action"],
        kept_headers: &[
            "request-id",
            "sentry-hook-resource",
            "sentry-hook-timestamp",
            "sentry-hook-signature",
        ],
        sample: r#"{"action":"{type}","data":{"issue":{"id":"1"}},"installation":{"uuid":"u1"}}"#,
        sample_type: "created",
        ..BASE
    },
    Preset {
        name: "pagerduty",
        scheme: || {
            rule(
                "pagerduty",
                Alg::Hmac(S256),
                HEX,
                vec![Piece::Body],
                Carrier::Header {
                    name: "X-PagerDuty-Signature".to_owned(),
                    prefix: "v1=".to_owned(),
                    list: Some(','),
                },
                None,
            )
        },
        key: &["json:/event/id"],
        event_type: &["json:/event/event_type"],
        kept_headers: &["x-pagerduty-signature", "x-webhook-id"],
        sample: r#"{"event":{"id":"{id}","event_type":"{type}","resource_type":"incident","data":{}}}"#,
        sample_type: "incident.triggered",
        ..BASE
    },
    Preset {
        name: "msgraph",
        scheme: || Scheme::Code(code::MSGRAPH),
        // Without an id: a change by its subscription, change, resource
        // and version; a lifecycle event by its subscription, event and
        // the expiry it is about.
        key_fallback: &[
            "json:/subscriptionId",
            "json:/changeType|json:/lifecycleEvent",
            "json:/resource|json:/subscriptionExpirationDateTime",
            "json:/resourceData/@odata.etag|json:/resourceData/id|json:/subscriptionExpirationDateTime",
        ],
        event_type: &["json:/lifecycleEvent|json:/changeType"],
        horizon: Some((4 * HOUR, "Graph retries for up to 4 hours")),
        handshake: Handshake::Echo(Echo {
            name: "Msgraph",
            methods: &[],
            when: None,
            answer: Answer::Challenge(Field::Query("validationToken")),
            unsigned: true,
            content_type: "text/plain",
            nosniff: false,
            as_sent: false,
        }),
        batch: Some(BatchShape {
            items: "/value",
            inner: "",
            delivery_id: None,
        }),
        sample: r#"{"value":[{"id":"{id}","subscriptionId":"s1","changeType":"{type}","resource":"Users/1/Messages/2","clientState":"{secret}","tenantId":"t1"}]}"#,
        sample_type: "created",
        ..BASE
    },
    Preset {
        name: "okta",
        scheme: || token("okta", "Authorization", "", Encoding::Text),
        key: &["json:/uuid"],
        event_type: &["json:/eventType"],
        handshake: Handshake::Okta,
        batch: Some(BatchShape {
            items: "/data/events",
            inner: "",
            delivery_id: Some("/eventId"),
        }),
        sample: r#"{"eventType":"com.okta.event_hook","eventId":"b{id}","data":{"events":[{"uuid":"{id}","eventType":"{type}","published":"2026-01-01T00:00:00Z"}]}}"#,
        sample_type: "user.session.start",
        ..BASE
    },
    Preset {
        name: "docusign",
        scheme: || {
            rule(
                "docusign",
                Alg::Hmac(S256),
                B64,
                vec![Piece::Body],
                Carrier::Numbered("X-DocuSign-Signature-".to_owned()),
                None,
            )
        },
        key: &[
            "json:/event",
            "json:/data/envelopeId",
            "json:/generatedDateTime",
        ],
        event_type: &["json:/event"],
        hash_without: &["/retryCount"],
        retention_days: 30,
        horizon: Some((
            15 * DAY,
            "DocuSign Connect retries failed messages for about 15 days",
        )),
        sample: r#"{"event":"{type}","apiVersion":"v2.1","generatedDateTime":"2026-01-01T00:00:00Z","retryCount":0,"data":{"envelopeId":"{id}"}}"#,
        sample_type: "envelope-completed",
        ..BASE
    },
    Preset {
        name: "mux",
        scheme: || {
            rule(
                "mux",
                Alg::Hmac(S256),
                HEX,
                dotted(),
                pairs("Mux-Signature"),
                ts_carrier(TimeFormat::Unix, Window::PastOnly),
            )
        },
        hash_without: &["/attempts"],
        tolerance_secs: Some(300),
        horizon: Some((DAY, "Mux retries for up to 24 hours")),
        kept_headers: &["mux-signature"],
        sample: r#"{"type":"{type}","id":"{id}","created_at":"2026-01-01T00:00:00Z","attempts":[],"data":{}}"#,
        sample_type: "video.asset.ready",
        ..BASE
    },
    Preset {
        name: "workos",
        scheme: || {
            rule(
                "workos",
                Alg::Hmac(S256),
                HEX,
                dotted(),
                pairs("WorkOS-Signature"),
                ts_carrier(TimeFormat::UnixMs, Window::Both),
            )
        },
        event_type: &["json:/event"],
        tolerance_secs: Some(180),
        horizon: Some((3 * DAY, "WorkOS retries 6 times over 3 days")),
        kept_headers: &["workos-signature"],
        sample: r#"{"id":"{id}","event":"{type}","data":{},"created_at":"2026-01-01T00:00:00Z"}"#,
        sample_type: "user.created",
        ..BASE
    },
    Preset {
        name: "trello",
        scheme: || {
            rule(
                "trello",
                Alg::Hmac(S1),
                B64,
                vec![Piece::Body, Piece::Url],
                header("X-Trello-Webhook", ""),
                None,
            )
        },
        key: &["json:/action/id"],
        event_type: &["json:/action/type"],
        kept_headers: &["x-trello-webhook"],
        // The callback URL checked before the webhook is created.
        handshake: Handshake::Echo(Echo {
            name: "Trello",
            methods: &["HEAD", "GET"],
            when: None,
            answer: Answer::Fixed {
                what: "callback check",
                body: "",
            },
            unsigned: true,
            content_type: "text/plain",
            nosniff: false,
            as_sent: false,
        }),
        sample: r#"{"action":{"id":"{id}","type":"{type}","data":{}},"model":{"id":"m1"}}"#,
        sample_type: "updateCard",
        ..BASE
    },
    Preset {
        name: "asana",
        scheme: || body_hmac("asana", S256, HEX, "X-Hook-Signature", ""),
        key: &["body:sha256"],
        event_type: &["json:/resource/resource_type", "json:/action"],
        horizon: Some((DAY, "Asana retries for up to 24 hours")),
        kept_headers: &["x-hook-signature"],
        handshake: Handshake::Asana,
        batch: Some(BatchShape {
            items: "/events",
            inner: "",
            delivery_id: None,
        }),
        sample: r#"{"events":[{"user":{"gid":"1"},"created_at":"2026-01-01T00:00:00Z","action":"{type}","resource":{"gid":"{id}","resource_type":"task"}}]}"#,
        sample_type: "changed",
        ..BASE
    },
    Preset {
        name: "notion",
        scheme: || body_hmac("notion", S256, HEX, "X-Notion-Signature", "sha256="),
        hash_without: &["/attempt_number"],
        kept_headers: &["x-notion-signature"],
        handshake: Handshake::Notion,
        sample: r#"{"id":"{id}","timestamp":"2026-01-01T00:00:00Z","type":"{type}","attempt_number":1,"entity":{"id":"e1","type":"page"}}"#,
        sample_type: "page.created",
        ..BASE
    },
    Preset {
        name: "webflow",
        scheme: || {
            rule(
                "webflow",
                Alg::Hmac(S256),
                HEX,
                vec![
                    Piece::Header("x-webflow-timestamp".to_owned()),
                    Piece::Text(":".to_owned()),
                    Piece::Body,
                ],
                header("x-webflow-signature", ""),
                ts_header("x-webflow-timestamp", TimeFormat::UnixMs, Window::Both),
            )
        },
        key: &["json:/triggerType", "json:/payload/id"],
        event_type: &["json:/triggerType"],
        tolerance_secs: Some(300),
        kept_headers: &["x-webflow-signature", "x-webflow-timestamp"],
        sample: r#"{"triggerType":"{type}","payload":{"id":"{id}","name":"Contact","data":{}}}"#,
        sample_type: "form_submission",
        ..BASE
    },
    Preset {
        name: "postmark",
        scheme: || token("postmark", "Authorization", "Basic ", B64),
        key: &[
            "json:/RecordType",
            "json:/MessageID",
            "json:/ReceivedAt|json:/DeliveredAt|json:/BouncedAt|json:/ChangedAt",
        ],
        event_type: &["json:/RecordType"],
        sample: r#"{"RecordType":"{type}","MessageID":"{id}","DeliveredAt":"2026-01-01T00:00:00Z","Recipient":"a@example.com"}"#,
        sample_type: "Delivery",
        ..BASE
    },
    Preset {
        name: "launchdarkly",
        scheme: || body_hmac("launchdarkly", S256, HEX, "X-LD-Signature", ""),
        key: &["json:/_id"],
        event_type: &["json:/kind"],
        kept_headers: &["x-ld-signature"],
        sample: r#"{"_id":"{id}","kind":"{type}","date":{now}000,"title":"changed"}"#,
        sample_type: "flag",
        ..BASE
    },
    Preset {
        name: "persona",
        scheme: || {
            rule(
                "persona",
                Alg::Hmac(S256),
                HEX,
                dotted(),
                pairs("Persona-Signature"),
                ts_carrier(TimeFormat::Unix, Window::Both),
            )
        },
        key: &["json:/data/id"],
        event_type: &["json:/data/attributes/name"],
        tolerance_secs: Some(300),
        kept_headers: &["persona-signature"],
        sample: r#"{"data":{"type":"event","id":"{id}","attributes":{"name":"{type}","payload":{}}}}"#,
        sample_type: "inquiry.completed",
        ..BASE
    },
    Preset {
        name: "recurly",
        scheme: || {
            rule(
                "recurly",
                Alg::Hmac(S256),
                HEX,
                dotted(),
                Carrier::Positional("recurly-signature".to_owned()),
                ts_carrier(TimeFormat::UnixMs, Window::Both),
            )
        },
        event_type: &["json:/object_type", "json:/event_type"],
        tolerance_secs: Some(300),
        kept_headers: &["recurly-signature"],
        sample: r#"{"id":"{id}","object_type":"charge_invoice","event_type":"{type}","site_id":"s1"}"#,
        sample_type: "paid",
        ..BASE
    },
];

/// The preset named `name`.
pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// Other names of the table's kinds (Clerk, Resend and Svix send Standard Webhooks).
pub fn alias(name: &str) -> Option<&'static str> {
    match name {
        "clerk" | "resend" | "svix" => Some("standard"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::key_rule::Part;

    #[test]
    fn every_row_parses_and_names_are_unique() {
        let mut names = std::collections::HashSet::new();
        for p in PRESETS {
            assert!(names.insert(p.name), "{} twice", p.name);
            for spec in p
                .key
                .iter()
                .chain(p.key_fallback)
                .chain(p.event_type)
                .chain(p.hash)
            {
                Part::parse(spec).unwrap_or_else(|e| panic!("{}: {e}", p.name));
            }
            assert_eq!((p.scheme)().kind(), p.name);
            assert!(p.retention_days >= 7);
            if let Some((secs, _)) = p.horizon {
                assert!(secs <= p.retention_days * DAY, "{}", p.name);
            }
        }
        assert_eq!(PRESETS.len(), 44);
    }

    #[test]
    fn a_timestamp_read_after_the_signature_is_not_signed_apart() {
        for p in PRESETS {
            if let Scheme::Rule { rule, .. } = (p.scheme)()
                && let Some(Timestamp {
                    from: TimeFrom::Member(_),
                    ..
                }) = rule.timestamp
            {
                assert!(rule.covers(&Piece::Body), "{}", p.name);
                assert!(!rule.covers(&Piece::Timestamp), "{}", p.name);
            }
        }
    }

    #[test]
    fn versioned_carriers_sign_only_what_their_path_reads() {
        for p in PRESETS {
            if let Scheme::Rule { rule, .. } = (p.scheme)()
                && let Carrier::Versioned { families, versions } = &rule.carrier
            {
                // `send` signs as the first version, with the rule's alg.
                assert_eq!(versions.first().map(|v| v.1), Some(rule.alg), "{}", p.name);
                let id = families.first().map(|f| f.id).unwrap_or_default();
                for piece in &rule.message {
                    assert!(
                        matches!(
                            piece,
                            Piece::Timestamp | Piece::Body | Piece::Text(_) | Piece::Method
                        ) || *piece == Piece::Header(id.to_owned()),
                        "{}: {piece:?}",
                        p.name
                    );
                }
            }
        }
    }

    #[test]
    fn stamped_carriers_sign_only_what_their_direct_path_reads() {
        for p in PRESETS {
            if let Scheme::Rule { rule, .. } = (p.scheme)()
                && matches!(rule.carrier, Carrier::Stamped { .. })
            {
                assert!(matches!(rule.alg, Alg::Hmac(_)), "{}", p.name);
                for piece in &rule.message {
                    assert!(
                        matches!(
                            piece,
                            Piece::Timestamp | Piece::Body | Piece::Text(_) | Piece::Method
                        ),
                        "{}: {piece:?}",
                        p.name
                    );
                }
            }
        }
    }
}
