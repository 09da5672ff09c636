//! Workloads and their requests: Stripe-like events, really signed.

use super::*;

#[derive(Debug, Clone)]
pub(crate) struct Workload {
    pub(crate) name: &'static str,
    pub(crate) what: String,
    pub(crate) events: usize,
    pub(crate) copies: usize,
    pub(crate) conns: usize,
    pub(crate) forward: bool,
    /// The forward action's `order` rule, for the ordered variants of W4.
    pub(crate) order: Option<&'static str>,
    /// Where the forward action sends (W4's variants).
    pub(crate) dest: Dest,
    /// False: the forward action has `circuit_failures = 0` (no circuit).
    pub(crate) circuit: bool,
    /// Run only when named in `--only` (W4's variants).
    pub(crate) only_named: bool,
}

/// A forward action's destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dest {
    Http,
    Redis,
    Nats,
    Amqp,
}

impl Workload {
    pub(crate) fn requests(&self) -> usize {
        self.events * self.copies
    }
}

pub(crate) fn workloads(o: &Opts) -> Vec<Workload> {
    let w = |name, events: usize, copies, conns: usize, forward, what: &str| Workload {
        name,
        what: what
            .replace("{n}", &fmt_int(o.scaled(events) as f64))
            .replace("{c}", &conns.to_string()),
        events: o.scaled(events),
        copies,
        conns,
        forward,
        order: None,
        dest: Dest::Http,
        circuit: true,
        only_named: false,
    };
    let variant = |name, events, what: &str| Workload {
        only_named: true,
        ..w(name, events, 1, 64, true, what)
    };
    vec![
        w("W1", 20_000, 1, 64, false, "{n} unique events, {c} conns"),
        w(
            "W2",
            2_000,
            8,
            64,
            false,
            "{n} events x8, dups concurrent, {c} conns",
        ),
        w("W3", 5_000, 1, 4, false, "{n} unique events, {c} conns"),
        w("W4", 10_000, 1, 64, true, "{n} events forwarded, {c} conns"),
        Workload {
            order: Some("json:/data/object/customer"),
            ..variant(
                "W4O",
                10_000,
                "{n} events forwarded, ordered over 1,000 customers, {c} conns",
            )
        },
        Workload {
            order: Some("json:/object"),
            ..variant(
                "W4S",
                1_000,
                "{n} events forwarded, all of one order key (strictly serial), {c} conns",
            )
        },
        Workload {
            circuit: false,
            ..variant(
                "W4C0",
                10_000,
                "{n} events forwarded, circuit_failures = 0 (no circuit), {c} conns",
            )
        },
        Workload {
            dest: Dest::Redis,
            ..variant(
                "W4R",
                10_000,
                "{n} events forwarded to a Redis stream (appendfsync always), {c} conns",
            )
        },
        Workload {
            dest: Dest::Nats,
            ..variant(
                "W4N",
                10_000,
                "{n} events forwarded to a NATS JetStream stream, {c} conns",
            )
        },
        Workload {
            dest: Dest::Amqp,
            ..variant(
                "W4A",
                10_000,
                "{n} events forwarded to a RabbitMQ exchange (publisher confirms), {c} conns",
            )
        },
    ]
    .into_iter()
    // The variants only when named (`--only W4,W4O,W4C0,W4R`).
    .filter(|w| {
        !w.only_named
            || o.only
                .as_ref()
                .is_some_and(|only| only.iter().any(|n| n == w.name))
    })
    .collect()
}

/// splitmix64: a bijection on u64, so distinct inputs give distinct ids.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub(crate) fn base62(mut v: u64, width: usize, out: &mut String) {
    let mut digits = [b'0'; 16];
    for d in digits.iter_mut().take(width).rev() {
        *d = BASE62[(v % 62) as usize];
        v /= 62;
    }
    out.push_str(std::str::from_utf8(&digits[..width]).unwrap_or(""));
}

/// A Stripe-like event id, random-looking and unique per (seed, i): 11
/// base62 digits of a bijection of the index, then 13 of noise.
pub(crate) fn event_id(seed: u64, i: u64, prefix: &str) -> String {
    let mut s = String::with_capacity(4 + ID_CHARS);
    s.push_str(prefix);
    base62(mix(seed.wrapping_mul(0x1_0000_0000) ^ i), 11, &mut s);
    base62(mix(i ^ 0xA5A5_5A5A ^ seed.rotate_left(17)), 13, &mut s);
    s
}

pub(crate) fn noise(seed: u64, n: usize) -> String {
    let mut s = String::with_capacity(n);
    let mut k = 0;
    while s.len() < n {
        base62(mix(seed ^ k), 10, &mut s);
        k += 1;
    }
    s.truncate(n);
    s
}

/// A realistic `charge.succeeded` event, about 1.5 KiB, compact as sent.
pub(crate) fn stripe_event(id: &str, i: u64, created: i64) -> String {
    let n = |tag: u64, len: usize| noise(mix(i ^ (tag << 56)), len);
    let amount = 500 + (mix(i) % 50_000) as i64;
    format!(
        concat!(
            r#"{{"id":"{id}","object":"event","api_version":"2024-06-20","created":{created},"#,
            r#""data":{{"object":{{"id":"ch_3{ch}","object":"charge","amount":{amount},"amount_captured":{amount},"#,
            r#""amount_refunded":0,"application_fee_amount":null,"#,
            r#""balance_transaction":"txn_3{txn}","billing_details":{{"address":{{"city":"Berlin","country":"DE","#,
            r#""line1":"Torstrasse 1","line2":null,"postal_code":"10119","state":null}},"email":"jenny.rosen@example.com","#,
            r#""name":"Jenny Rosen","phone":null}},"calculated_statement_descriptor":"IDEMHOOK BENCH","captured":true,"#,
            r#""created":{created},"currency":"eur","customer":"cus_{cus}","description":"Order #{order}","#,
            r#""failure_code":null,"failure_message":null,"#,
            r#""livemode":false,"metadata":{{"order_id":"{order}"}},"#,
            r#""outcome":{{"risk_level":"normal","risk_score":{risk},"#,
            r#""seller_message":"Payment complete.","type":"authorized"}},"paid":true,"payment_intent":"pi_3{pi}","#,
            r#""payment_method":"pm_1{pm}","payment_method_details":{{"card":{{"brand":"visa","#,
            r#""checks":{{"cvc_check":"pass"}},"#,
            r#""country":"US","exp_month":8,"exp_year":2027,"fingerprint":"{fp}","funding":"credit","#,
            r#""last4":"4242","network":"visa","wallet":null}},"type":"card"}},"#,
            r#""receipt_email":null,"receipt_url":"https://pay.stripe.com/receipts/payment/{receipt}","#,
            r#""refunded":false,"shipping":null,"status":"succeeded"}}}},"#,
            r#""livemode":false,"pending_webhooks":1,"request":{{"id":"req_{req}","idempotency_key":"{idem}"}},"#,
            r#""type":"charge.succeeded"}}"#
        ),
        id = id,
        created = created,
        amount = amount,
        ch = n(1, 23),
        txn = n(2, 23),
        // 1,000 customers, each with every 1,000th event (W4O orders by them).
        cus = noise(mix((i % 1_000) ^ (3 << 56)), 14),
        order = 100_000 + i,
        risk = mix(i) % 60,
        pi = n(4, 23),
        pm = n(5, 23),
        fp = n(6, 16),
        receipt = n(7, 56),
        req = n(8, 14),
        idem = format!(
            "{}-{}-{}-{}-{}",
            n(9, 8),
            n(10, 4),
            n(11, 4),
            n(12, 4),
            n(13, 12)
        ),
    )
}

pub(crate) fn sign(body: &[u8], t: i64) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(SECRET.as_bytes())
        .expect("hmac takes any key length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

pub(crate) fn request_bytes(body: &[u8], t: i64) -> Vec<u8> {
    let mut r = Vec::with_capacity(body.len() + 400);
    let _ = write!(
        r,
        "POST /hooks/stripe HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         User-Agent: Stripe/1.0 (+https://stripe.com/docs/webhooks)\r\n\
         Accept: */*; q=0.5, application/xml\r\nCache-Control: no-cache\r\n\
         Content-Type: application/json; charset=utf-8\r\n\
         Stripe-Signature: {}\r\nContent-Length: {}\r\n\r\n",
        sign(body, t),
        body.len()
    );
    r.extend_from_slice(body);
    r
}

/// The requests of one workload, in send order: each event's copies are
/// adjacent, so they go out on different connections at the same time.
pub(crate) struct Requests {
    pub(crate) bytes: Vec<Vec<u8>>,
    /// The event index of each request.
    pub(crate) event_of: Vec<u32>,
    pub(crate) body_bytes: usize,
}

pub(crate) fn build_requests(w: &Workload, seed: u64) -> Requests {
    let t = unix_secs();
    let mut bytes = Vec::with_capacity(w.requests());
    let mut event_of = Vec::with_capacity(w.requests());
    let mut body_bytes = 0;
    for e in 0..w.events {
        let id = event_id(seed, e as u64, "evt_");
        let body = stripe_event(&id, e as u64, t - 2);
        body_bytes += body.len();
        for k in 0..w.copies {
            // A provider signs every attempt afresh; the body is the same.
            bytes.push(request_bytes(body.as_bytes(), t + (k as i64 % 3)));
            event_of.push(e as u32);
        }
    }
    Requests {
        bytes,
        event_of,
        body_bytes: body_bytes / w.events.max(1),
    }
}
