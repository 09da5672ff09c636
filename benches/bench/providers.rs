//! `--providers`: what verification costs on the hot path. W1 (unique
//! events, 64 connections) against one source of kind stripe, twilio (a
//! form body signed with the URL and its sorted fields, HMAC-SHA1) and
//! discord (Ed25519) and the generic `hmac` kind configured as Discord
//! signs (Ed25519 over timestamp and body), each run in turn so the three share the machine's
//! noise, reported as medians and as ratios to stripe in the same run;
//! then one Adyen batch of 1,000 notifications posted to a fresh SQLite
//! database, timed from the first byte sent to the answer (verifying
//! every item's signature, claiming every event in one transaction).
//!
//! The requests are signed with idemhook's own signers (`Verifier::
//! sign_request`, as `idemhook send` does), whose rules the unit tests
//! check against the providers' libraries.

use super::*;

use idemhook::config::Config;
use idemhook::verify::Request;

/// The vectors' Ed25519 test key (also in `tests/vectors/providers.json`).
fn discord_keys() -> Result<(String, String), String> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/vectors/providers.json"
    ))
    .map_err(|e| e.to_string())?;
    let file: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let v = file["vectors"]
        .as_array()
        .and_then(|all| {
            all.iter()
                .find(|v| v["kind"] == "discord" && v["private_key_pem"].is_string())
        })
        .ok_or("no discord vector with a key")?;
    Ok((
        v["secrets"][0].as_str().unwrap_or_default().to_string(),
        v["private_key_pem"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    ))
}

const TWILIO_URL: &str = "https://hooks.example.com/hooks/stripe";
const ADYEN_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

/// The source table of `kind` (named `stripe`, so every request goes to
/// the same route).
fn source_table(kind: &str) -> Result<String, String> {
    Ok(match kind {
        "stripe" => format!("kind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n"),
        "twilio" => {
            format!("kind = \"twilio\"\nsecrets = [\"{SECRET}\"]\npublic_url = \"{TWILIO_URL}\"\n")
        }
        "discord" => format!(
            "kind = \"discord\"\nsecrets = [\"{}\"]\n",
            discord_keys()?.0
        ),
        // Discord's rule as a generic kind: Ed25519 over timestamp and body.
        "hmac-ed25519" => format!(
            "kind = \"hmac\"\nsecrets = [\"{}\"]\nalgorithm = \"ed25519\"\nencoding = \"hex\"\n\
             header = \"X-Signature-Ed25519\"\ntemplate = \"{{timestamp}}{{body}}\"\n\
             timestamp_header = \"X-Signature-Timestamp\"\nkey = [\"json:/id\"]\ntype = \"json:/type\"\n",
            discord_keys()?.0
        ),
        "adyen" => format!("kind = \"adyen\"\nsecrets = [\"{ADYEN_KEY}\"]\n"),
        other => return Err(format!("no bench source for {other}")),
    })
}

fn verifier_config(kind: &str) -> Result<Config, String> {
    let toml = format!(
        "database = \"unused.db\"\n[sources.stripe]\n{}",
        source_table(kind)?
    );
    Config::parse(&toml, "bench", Path::new("."), None).map_err(|e| e.to_string())
}

/// A Twilio status callback of about the size Twilio sends.
fn twilio_body(id: &str, i: u64) -> String {
    format!(
        "AccountSid=AC{acct}&ApiVersion=2010-04-01&ChannelInstallSid=XE{n1}&ChannelPrefix=SMS\
         &ChannelStatusMessage=Message+delivered&ChannelToAddress=%2B1555{to}&ErrorCode=&From=%2B15557654321\
         &MessageSid=SM{id}&MessageStatus=delivered&MessagingServiceSid=MG{n2}&SmsSid=SM{id}\
         &SmsStatus=delivered&StructuredMessage=false&To=%2B1555{to}&Body=Your+order+{i}+has+shipped",
        acct = noise(i ^ 7, 32),
        n1 = noise(i ^ 11, 32),
        n2 = noise(i ^ 13, 32),
        to = 1_000_000 + i % 9_000_000,
    )
}

/// W1's requests for a source of `kind`, signed as its provider signs.
fn requests_for(kind: &str, w: &Workload, seed: u64) -> Result<Requests, String> {
    let config = verifier_config(kind)?;
    let verifier = &config.sources[0].verifier;
    let private_key = if kind == "discord" || kind == "hmac-ed25519" {
        Some(discord_keys()?.1)
    } else {
        None
    };
    let t = unix_secs();
    let mut bytes = Vec::with_capacity(w.events);
    let mut body_bytes = 0;
    for e in 0..w.events {
        let id = event_id(seed, e as u64, "evt_");
        let (body, content_type, mut headers) = match kind {
            "twilio" => (
                twilio_body(&id, e as u64),
                "application/x-www-form-urlencoded",
                vec![("I-Twilio-Idempotency-Token".to_string(), id.clone())],
            ),
            _ => (
                stripe_event(&id, e as u64, t - 2),
                "application/json; charset=utf-8",
                Vec::new(),
            ),
        };
        body_bytes += body.len();
        let signed = verifier.sign_request(
            &Request::post(&headers, body.as_bytes()),
            t,
            &id,
            private_key.as_deref(),
        )?;
        headers.extend(signed);
        let mut r = Vec::with_capacity(body.len() + 400);
        let _ = write!(
            r,
            "POST /hooks/stripe HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        );
        for (name, value) in &headers {
            let _ = write!(r, "{name}: {value}\r\n");
        }
        let _ = write!(r, "Content-Length: {}\r\n\r\n", body.len());
        r.extend_from_slice(body.as_bytes());
        bytes.push(r);
    }
    Ok(Requests {
        event_of: (0..w.events as u32).collect(),
        bytes,
        body_bytes: body_bytes / w.events.max(1),
    })
}

/// A fresh idemhook in a temp dir, its one source of `kind`.
fn start(kind: &str, opts: &Opts) -> Result<(tempfile::TempDir, Idemhook), String> {
    let dir = tempfile::Builder::new()
        .prefix("idemhook-bench-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let config = idemhook_config(opts.idem_workers, None, None).replace(
        &format!("kind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n"),
        &source_table(kind)?,
    );
    let server = Idemhook::start(dir.path(), &config, opts)?;
    Ok((dir, server))
}

/// One idemhook with a source of `kind` under `reqs`: requests a second.
fn run_kind(
    kind: &str,
    reqs: &Requests,
    w: &Workload,
    opts: &Opts,
) -> Result<(f64, f64, f64), String> {
    let (dir, server) = start(kind, opts)?;
    let load = run_load(server.addr, &reqs.bytes, w.conns);
    let (ok, log) = server.stop();
    let stored = count_rows(&dir.path().join("idemhook.db"), 0)
        .map_err(|e| e.to_string())?
        .0;
    if !ok || !load.clean() || stored != w.events as i64 {
        return Err(format!(
            "{kind}: {} stored of {}, problems {}; {}",
            stored,
            w.events,
            load.problems(),
            log.lines().last().unwrap_or("")
        ));
    }
    Ok((load.rps(), load.p(50.0), load.p(99.0)))
}

/// 1,000 Adyen notifications in one request, signed per item.
fn adyen_batch(seed: u64, n: usize) -> Result<Vec<u8>, String> {
    let config = verifier_config("adyen")?;
    let items: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({"NotificationRequestItem": {
                "pspReference": event_id(seed, i as u64, "PSP"), "originalReference": "",
                "merchantAccountCode": "BenchMerchant", "merchantReference": format!("order-{i}"),
                "amount": {"value": 1000 + i, "currency": "EUR"}, "eventCode": "AUTHORISATION",
                "success": "true", "eventDate": "2026-01-01T00:00:00+01:00",
                "paymentMethod": "visa", "reason": "012345:1111:03/2030",
                "additionalData": {}}})
        })
        .collect();
    let body = serde_json::json!({"live": "false", "notificationItems": items}).to_string();
    config.sources[0]
        .verifier
        .sign_body(body.as_bytes(), unix_secs())
}

/// Posts the batch to a fresh idemhook: the time to the answer.
fn run_batch(warm_up: &[u8], body: &[u8], opts: &Opts) -> Result<f64, String> {
    let (dir, server) = start("adyen", opts)?;
    let post = |body: &[u8]| {
        let mut request = format!(
            "POST /hooks/stripe HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        request
    };
    let request = post(body);
    let mut conn = Conn::connect(server.addr).map_err(|e| e.to_string())?;
    // A one-event batch first, so the timing is the big batch's alone.
    let warm = conn
        .exchange(&post(warm_up), Instant::now() + Duration::from_secs(30))
        .map_err(|e| format!("{e:?}"))?;
    if warm.status != 200 {
        return Err(format!("the warm-up batch was answered {}", warm.status));
    }
    let started = Instant::now();
    let response = conn
        .exchange(&request, Instant::now() + Duration::from_secs(30))
        .map_err(|e| format!("{e:?}"))?;
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    let (_, log) = server.stop();
    let stored = count_rows(&dir.path().join("idemhook.db"), 0)
        .map_err(|e| e.to_string())?
        .0;
    if response.status != 200 || stored != 1001 {
        return Err(format!(
            "status {}, {stored} stored; {}",
            response.status,
            log.lines().last().unwrap_or("")
        ));
    }
    Ok(elapsed)
}

pub(crate) fn run(opts: &Opts, seed: u64) -> ExitCode {
    let w = workloads(opts)
        .into_iter()
        .find(|w| w.name == "W1")
        .expect("W1 exists");
    let kinds = ["stripe", "twilio", "discord", "hmac-ed25519"];
    println!(
        "\nProviders: W1 ({} unique events, {} conns) per source kind, the kinds in turn each run",
        w.events, w.conns
    );
    let mut rates: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for run in 1..=opts.runs {
        for kind in kinds {
            let reqs = match requests_for(kind, &w, seed ^ run as u64) {
                Ok(r) => r,
                Err(e) => {
                    println!("  {kind}: cannot build requests: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match run_kind(kind, &reqs, &w, opts) {
                Ok((rps, p50, p99)) => {
                    println!(
                        "  run {run} {kind:<8} {} req/s (p50 {} p99 {} ms), body {} B",
                        fmt_int(rps),
                        ms(p50),
                        ms(p99),
                        reqs.body_bytes
                    );
                    rates.entry(kind).or_default().push(rps);
                }
                Err(e) => {
                    println!("  run {run} {kind}: FAILED: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    let base = median(rates.get("stripe").map_or(&[][..], Vec::as_slice));
    println!("\n| kind | req/s median (min–max) | / stripe |\n|---|---|---|");
    for kind in kinds {
        let v = rates.get(kind).cloned().unwrap_or_default();
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        println!(
            "| {kind} | {} ({}–{}) | {:.2} |",
            fmt_int(median(&v)),
            fmt_int(lo),
            fmt_int(hi),
            median(&v) / base.max(1e-9)
        );
    }
    // The generic kind against the named one it mirrors, run by run.
    let pairs: Vec<f64> = rates
        .get("hmac-ed25519")
        .into_iter()
        .flatten()
        .zip(rates.get("discord").into_iter().flatten())
        .map(|(g, d)| g / d.max(1e-9))
        .collect();
    let r = median(&pairs);
    println!(
        "\nhmac-ed25519 (generic) within 5% of discord: {r:.2} {}",
        if (0.95..).contains(&r) {
            "met"
        } else {
            "NOT met"
        }
    );
    println!("\nAdyen: one batch of 1,000 notifications, each signed, to a fresh SQLite database");
    let mut times = Vec::new();
    for run in 1..=opts.runs {
        let body = match adyen_batch(seed ^ (run as u64) << 8, 1000) {
            Ok(b) => b,
            Err(e) => {
                println!("  cannot build the batch: {e}");
                return ExitCode::FAILURE;
            }
        };
        let warm_up = match adyen_batch(!seed ^ run as u64, 1) {
            Ok(b) => b,
            Err(e) => {
                println!("  cannot build the warm-up batch: {e}");
                return ExitCode::FAILURE;
            }
        };
        match run_batch(&warm_up, &body, opts) {
            Ok(t) => {
                println!(
                    "  run {run}: {t:.1} ms to the answer ({} KiB)",
                    body.len() / 1024
                );
                times.push(t);
            }
            Err(e) => {
                println!("  run {run}: FAILED: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!("  median {:.1} ms", median(&times));
    ExitCode::SUCCESS
}
