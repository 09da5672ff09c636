#!/usr/bin/env python3
"""Writes tests/vectors/providers.json: webhook signature test vectors made with
each provider's official library (PyPI packages in requirements.txt, npm
packages in package.json through gen.mjs).

Every vector, genuine or negative, is run through the library's verifier and
`valid` records its answer. Where a library checks no timestamp window (or has
no verifier), `valid` follows PROVIDERS.md's rule and `source` says so.

Usage (see README.md):
    /tmp/vecenv/bin/python tests/vectors/gen/gen.py --node-dir /tmp/vecnpm
"""
import argparse
import base64
import contextlib
import copy
import datetime as dt
import hashlib
import hmac
import importlib.metadata as md
import io
import json
import os
import shutil
import subprocess
import sys
import time
from urllib.parse import parse_qsl, urlencode

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "providers.json")
NOW = 1764460800  # 2025-11-30T00:00:00Z: the time every vector is signed and verified at

VECTORS = []


# ---------------------------------------------------------------- helpers

def pyv(pkg):
    return f"PyPI {pkg} {md.version(pkg)}"


def sha256_hex(s):
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def hmac_hex(key, msg, algo=hashlib.sha256):
    return hmac.new(key.encode(), msg.encode(), algo).hexdigest()


def hmac_b64(key, msg, algo=hashlib.sha256):
    return base64.b64encode(hmac.new(key.encode(), msg.encode(), algo).digest()).decode()


def cj(obj):
    """Compact JSON, the way most providers send it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def hget(req, name):
    for k, v in req["headers"]:
        if k.lower() == name.lower():
            return v
    return None


def hdict(req, lower=True):
    return {(k.lower() if lower else k): v for k, v in req["headers"]}


def full_url(req, url=None):
    u = url if url is not None else req["public_url"]
    return (u or "") + ("?" + req["query"] if req["query"] else "")


def rfc3339(ts, offset_hours=0, frac=""):
    tz = dt.timezone(dt.timedelta(hours=offset_hours))
    s = dt.datetime.fromtimestamp(ts, tz).strftime("%Y-%m-%dT%H:%M:%S") + frac
    if offset_hours == 0:
        return s + "Z"
    return s + dt.datetime.fromtimestamp(ts, tz).strftime("%z")[:3] + ":" + dt.datetime.fromtimestamp(ts, tz).strftime("%z")[3:]


_FROZEN = [None]


class _FrozenDateTime(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return dt.datetime.fromtimestamp(_FROZEN[0], tz)

    @classmethod
    def utcnow(cls):
        return dt.datetime.utcfromtimestamp(_FROZEN[0])


@contextlib.contextmanager
def frozen(now):
    """Make the libraries' clocks (time.time, datetime.now) read `now`."""
    import hubspot.utils.signature as hs
    import standardwebhooks.webhooks as sw
    old_time = time.time
    old = [(hs, hs.datetime), (sw, sw.datetime)]
    _FROZEN[0] = now
    time.time = lambda: float(now)
    for mod, _ in old:
        mod.datetime = _FrozenDateTime
    try:
        yield
    finally:
        time.time = old_time
        for mod, val in old:
            mod.datetime = val


def quiet(fn, *a, **k):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*a, **k)


def raises_not(fn, *a, **k):
    """True when the library's verifier returns without raising."""
    try:
        return fn(*a, **k) is not False
    except Exception:
        return False


class Node:
    """gen.mjs as a line-oriented RPC server, run from the npm folder."""

    def __init__(self, node_dir):
        self.dir = node_dir
        shutil.copy(os.path.join(HERE, "gen.mjs"), os.path.join(node_dir, "gen.mjs"))
        self.p = subprocess.Popen(["node", "gen.mjs"], cwd=node_dir, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def __call__(self, op, **args):
        self.p.stdin.write(json.dumps({"op": op, "args": args}) + "\n")
        self.p.stdin.flush()
        ans = json.loads(self.p.stdout.readline())
        if not ans["ok"]:
            raise RuntimeError(ans["error"])
        return ans["result"]

    def version(self, pkg):
        with open(os.path.join(self.dir, "node_modules", pkg, "package.json")) as f:
            return f"npm {pkg} {json.load(f)['version']}"

    def close(self):
        self.p.stdin.close()
        self.p.wait()


NODE = None


def emit(kind, name, source, secrets, req, valid, mutation=None, event_ids=None,
         event_types=None, pk=None, now=NOW):
    VECTORS.append({
        "kind": kind,
        "name": name,
        "source": source,
        "secrets": list(secrets),
        "public_url": req.get("public_url"),
        "method": req.get("method", "POST"),
        "query": req.get("query", ""),
        "headers": [list(h) for h in req["headers"]],
        "body": req["body"],
        "now": now,
        "valid": bool(valid),
        "mutation": mutation,
        "event_ids": event_ids,
        "event_types": event_types,
        "private_key_pem": pk,
    })


def kind_set(kind, *, name, source, secrets, sign_key, wrong_key, body, tamper, sign, verify,
             event_ids, event_types, sig_headers=(), tolerance=None, future=False,
             public_url=None, query="", method="POST", pk=None, window_note=None,
             content_type="application/json"):
    """Genuine vector + the standard negatives for one kind.

    sign(key, body, ts, url, query) -> {"headers": [...], "body"?, "query"?}
    verify(req, secrets, now) -> bool, or (bool, note) to add a note to source.
    """

    def build(key, ts, url=public_url):
        r = sign(key, body, ts, url, query)
        req = {"public_url": public_url, "method": method, "query": r.get("query", query),
               "headers": ([["Content-Type", content_type]] if content_type else []) + r["headers"],
               "body": r.get("body", body)}
        return req

    def run(label, req, mutation, ids=None, types=None, extra_note=None):
        res = verify(req, secrets, NOW)
        note = None
        if isinstance(res, tuple):
            res, note = res
        src = source + (f"; {note}" if note else "") + (f"; {extra_note}" if extra_note else "")
        emit(kind, label, src, secrets, req, res, mutation, ids, types, pk)
        return res

    g = build(sign_key, NOW)
    ok = run(name, g, None, event_ids, event_types)
    assert ok, f"{kind}: genuine vector did not verify"

    t = copy.deepcopy(g)
    old, new = tamper
    assert old in t["body"], (kind, old)
    t["body"] = t["body"].replace(old, new, 1)
    run(f"{name}: tampered body", t, "tampered_body")

    w = build(wrong_key, NOW)
    r = run(f"{name}: wrong secret", w, "wrong_secret")
    assert not r, f"{kind}: wrong secret verified"

    if sig_headers:
        m = copy.deepcopy(g)
        m["headers"] = [h for h in m["headers"] if h[0].lower() not in [s.lower() for s in sig_headers]]
        r = run(f"{name}: signature header missing", m, "missing_header")
        assert not r, f"{kind}: missing header verified"

    if tolerance:
        s = build(sign_key, NOW - tolerance - 60)
        r = run(f"{name}: timestamp {tolerance + 60} s old", s, "stale_timestamp",
                extra_note=window_note)
        assert not r, f"{kind}: stale verified"
        if future:
            f = build(sign_key, NOW + tolerance + 60)
            r = run(f"{name}: timestamp {tolerance + 60} s ahead", f, "future_timestamp",
                    extra_note=window_note)
            assert not r, f"{kind}: future verified"

    if public_url:
        u = build(sign_key, NOW, url=public_url.replace("/hooks/", "/hooks/other-"))
        r = run(f"{name}: signed for another URL", u, "url_mismatch")
        assert not r, f"{kind}: url mismatch verified"
    return g


# ---------------------------------------------------------------- twilio

def gen_twilio():
    from twilio.request_validator import RequestValidator, get_signature_algorithm
    src = f"{pyv('twilio')} RequestValidator.compute_signature / validate"
    url = "https://example.com/hooks/twilio"
    token = "12345"

    def sign_form(algo=None):
        def sign(key, body, ts, u, q):
            params = dict(parse_qsl(body, keep_blank_values=True))
            sig = RequestValidator(key).compute_signature(u + ("?" + q if q else ""), params, algo)
            h = [["X-Twilio-Signature", sig], ["I-Twilio-Idempotency-Token", "5b9c6d3e-2f41-4a7b-9c1d-0e8f7a6b5c4d"]]
            if algo:
                h.append(["X-Twilio-Webhooks-Signature-Settings", "key=webhooks_sharedkey_KS0123456789abcdef,algorithm=HMAC_SHA256"])
            return {"headers": h}
        return sign

    def verify_form(req, secrets, now):
        params = dict(parse_qsl(req["body"], keep_blank_values=True))
        sig = hget(req, "X-Twilio-Signature") or ""
        algo = get_signature_algorithm(hget(req, "X-Twilio-Webhooks-Signature-Settings"))
        return any(RequestValidator(s).validate(full_url(req), params, sig, algo) for s in secrets)

    form = urlencode([("AccountSid", "AC0123456789abcdef0123456789abcdef"), ("ApiVersion", "2010-04-01"),
                      ("From", "+15017122661"), ("MessageSid", "SM1f0e8ae6ade43cb3c0ce4525424e404f"),
                      ("MessageStatus", "delivered"), ("SmsSid", "SM1f0e8ae6ade43cb3c0ce4525424e404f"),
                      ("SmsStatus", "delivered"), ("To", "+15558675310")])
    kind_set("twilio", name="form status callback", source=src, secrets=[token], sign_key=token,
             wrong_key="54321", body=form, tamper=("MessageStatus=delivered", "MessageStatus=failed"),
             sign=sign_form(), verify=verify_form, event_ids=["5b9c6d3e-2f41-4a7b-9c1d-0e8f7a6b5c4d"],
             event_types=["delivered"], sig_headers=["X-Twilio-Signature"], public_url=url,
             content_type="application/x-www-form-urlencoded")

    # signed with :443 in the URL (Twilio's backend does either); public_url has none
    def sign_port(key, body, ts, u, q):
        r = sign_form()(key, body, ts, u.replace("example.com", "example.com:443"), q)
        return r
    req = {"public_url": url, "method": "POST", "query": "",
           "headers": [["Content-Type", "application/x-www-form-urlencoded"]] + sign_port(token, form, NOW, url, "")["headers"],
           "body": form}
    v = verify_form(req, [token], NOW)
    assert v
    emit("twilio", "form status callback signed with :443 in the URL", src + " (validate tries with and without the port)",
         [token], req, v, None, ["5b9c6d3e-2f41-4a7b-9c1d-0e8f7a6b5c4d"], ["delivered"])

    # call status callback with a query string on the URL
    call = urlencode([("AccountSid", "AC0123456789abcdef0123456789abcdef"), ("CallSid", "CA9876543210fedcba9876543210fedc"),
                      ("CallStatus", "completed"), ("Direction", "outbound-api"), ("Duration", "1"),
                      ("From", "+15017122661"), ("To", "+15558675310")])
    kind_set("twilio", name="call status callback with a query string", source=src, secrets=[token],
             sign_key=token, wrong_key="54321", body=call, tamper=("Duration=1", "Duration=9"),
             sign=sign_form(), verify=verify_form, event_ids=["5b9c6d3e-2f41-4a7b-9c1d-0e8f7a6b5c4d"],
             event_types=["completed"], sig_headers=[], public_url=url, query="tenant=acme&v=2",
             content_type="application/x-www-form-urlencoded")

    # HMAC-SHA256 with the SharedKey secret
    shared = "webhooks_sharedkey_secret_0123456789abcdef"
    kind_set("twilio", name="form status callback, HMAC_SHA256 signature settings", source=src + " (algorithm=HMAC_SHA256)",
             secrets=[shared], sign_key=shared, wrong_key="webhooks_sharedkey_secret_other", body=form,
             tamper=("MessageStatus=delivered", "MessageStatus=failed"), sign=sign_form("HMAC_SHA256"),
             verify=verify_form, event_ids=["5b9c6d3e-2f41-4a7b-9c1d-0e8f7a6b5c4d"], event_types=["delivered"],
             sig_headers=[], public_url=url, content_type="application/x-www-form-urlencoded")

    # JSON body: bodySHA256 in the query, only the URL is signed
    def sign_json(key, body, ts, u, q):
        qq = "bodySHA256=" + sha256_hex(body)
        sig = RequestValidator(key).compute_signature(u + "?" + qq, {})
        return {"headers": [["X-Twilio-Signature", sig], ["I-Twilio-Idempotency-Token", "0f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"]], "query": qq}

    def verify_json(req, secrets, now):
        sig = hget(req, "X-Twilio-Signature") or ""
        return any(RequestValidator(s).validate(full_url(req), req["body"], sig) for s in secrets)

    jbody = cj({"AccountSid": "AC0123456789abcdef0123456789abcdef", "ConversationSid": "CH0123456789abcdef0123456789abcdef",
                "EventType": "onMessageAdded", "MessageSid": "IM0123456789abcdef0123456789abcdef",
                "Body": "hello", "Author": "alice", "DateCreated": "2025-11-30T00:00:00Z"})
    kind_set("twilio", name="JSON body with bodySHA256", source=src + " (validate(uri, body_string, signature))",
             secrets=[token], sign_key=token, wrong_key="54321", body=jbody, tamper=('"hello"', '"hellO"'),
             sign=sign_json, verify=verify_json, event_ids=["0f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"],
             event_types=None, sig_headers=["X-Twilio-Signature"], public_url=url)

    # Twilio's documentation vector
    dparams = [("CallSid", "CA1234567890ABCDE"), ("Caller", "+14158675309"), ("Digits", "1234"),
               ("From", "+14158675309"), ("To", "+18005551212")]
    dbody = urlencode(dparams)
    durl, dq = "https://mycompany.com/myapp.php", "foo=1&bar=2"
    sig = RequestValidator("12345").compute_signature(durl + "?" + dq, dict(dparams))
    assert sig == "RSOYDt4T1cUTdK1PDd93/VVr8B8=", sig
    req = {"public_url": durl, "method": "POST", "query": dq,
           "headers": [["Content-Type", "application/x-www-form-urlencoded"], ["X-Twilio-Signature", sig]], "body": dbody}
    emit("twilio", "Twilio docs vector (RSOYDt4T1cUTdK1PDd93/VVr8B8=)", src + "; Twilio docs and twilio-python tests example",
         ["12345"], req, verify_form(req, ["12345"], NOW), None, None, None)


# ---------------------------------------------------------------- sendgrid

def gen_sendgrid():
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from sendgrid.helpers.eventwebhook import EventWebhook
    n = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551

    def key(seed):
        d = int.from_bytes(hashlib.sha256(seed.encode()).digest(), "big") % (n - 1) + 1
        return ec.derive_private_key(d, ec.SECP256R1())

    priv, other = key("idemhook sendgrid test key 1"), key("idemhook sendgrid test key 2")
    pub = base64.b64encode(priv.public_key().public_bytes(serialization.Encoding.DER,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo)).decode()
    pem = priv.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()
    src = (f"signed with {pyv('cryptography')} ECDSA P-256/SHA-256 (RFC 6979 deterministic, DER); verified with "
           f"{pyv('sendgrid')} EventWebhook.verify_signature")

    def sign(k, body, ts, u, q):
        sig = k.sign((str(ts) + body).encode(), ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
        return {"headers": [["X-Twilio-Email-Event-Webhook-Signature", base64.b64encode(sig).decode()],
                            ["X-Twilio-Email-Event-Webhook-Timestamp", str(ts)]]}

    def verify(req, secrets, now):
        ew = EventWebhook()
        ts = hget(req, "X-Twilio-Email-Event-Webhook-Timestamp")
        sig = hget(req, "X-Twilio-Email-Event-Webhook-Signature")
        if ts is None or sig is None:
            return False
        lib = any(ew.verify_signature(req["body"], sig, ts, ew.convert_public_key_to_ecdsa(s)) for s in secrets)
        if abs(now - int(ts)) > 300:
            return False, f"library answered {lib} (it checks no window); valid from PROVIDERS.md tolerance 5m"
        return lib

    events = [
        {"email": "alice@example.com", "timestamp": NOW - 30, "smtp-id": "<14c5d75ce93.dfd.64b469@ismtpd-555>",
         "event": "processed", "category": ["welcome"], "sg_event_id": "rbtnWrG1DVDGGGFHFyun0A",
         "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000000"},
        {"email": "alice@example.com", "timestamp": NOW - 20, "smtp-id": "<14c5d75ce93.dfd.64b469@ismtpd-555>",
         "event": "delivered", "category": ["welcome"], "sg_event_id": "sZROwMGMagFgnOEmSdvhig",
         "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000000",
         "response": "250 OK"},
        {"email": "bob@example.com", "timestamp": NOW - 10, "event": "open", "sg_event_id": "Nx5h7fbX0xnWAOL6OgGbzA",
         "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.000000000000000000001",
         "useragent": "Mozilla/4.0", "ip": "255.255.255.255"},
    ]
    body = json.dumps(events) + "\r\n"
    kind_set("sendgrid", name="event batch (processed, delivered, open)", source=src, secrets=[pub], sign_key=priv,
             wrong_key=other, body=body, tamper=('"delivered"', '"bounce"'), sign=sign, verify=verify,
             event_ids=[e["sg_event_id"] for e in events], event_types=[e["event"] for e in events],
             sig_headers=["X-Twilio-Email-Event-Webhook-Signature"], tolerance=300, future=True, pk=pem)


# ---------------------------------------------------------------- discord

def gen_discord():
    import nacl.signing
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from discord_interactions import verify_key
    seed = hashlib.sha256(b"idemhook discord test key 1").digest()
    sk, other = nacl.signing.SigningKey(seed), nacl.signing.SigningKey(hashlib.sha256(b"idemhook discord test key 2").digest())
    pub = sk.verify_key.encode().hex()
    pem = Ed25519PrivateKey.from_private_bytes(seed).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    src = f"signed with {pyv('pynacl')} SigningKey.sign; verified with {pyv('discord-interactions')} verify_key"

    def sign(k, body, ts, u, q):
        return {"headers": [["X-Signature-Ed25519", k.sign((str(ts) + body).encode()).signature.hex()],
                            ["X-Signature-Timestamp", str(ts)]]}

    def verify(req, secrets, now):
        ts, sig = hget(req, "X-Signature-Timestamp"), hget(req, "X-Signature-Ed25519")
        if ts is None or sig is None:
            return False
        lib = any(quiet(verify_key, req["body"].encode(), sig, ts, s) for s in secrets)
        if abs(now - int(ts)) > 300:
            return False, f"library answered {lib} (it checks no window); valid from PROVIDERS.md tolerance 5m"
        return lib

    kind_set("discord", name="PING", source=src, secrets=[pub], sign_key=sk, wrong_key=other, body='{"type":1}',
             tamper=('1', '2'), sign=sign, verify=verify, event_ids=None, event_types=["1"],
             sig_headers=["X-Signature-Ed25519"], tolerance=300, future=True, pk=pem)
    cmd = cj({"app_permissions": "562949953601536", "application_id": "1234567890123456789",
              "channel_id": "987654321098765432", "data": {"id": "1122334455667788990", "name": "ping", "type": 1},
              "guild_id": "876543210987654321", "id": "1300000000000000001", "locale": "en-US",
              "member": {"user": {"id": "111111111111111111", "username": "alice"}},
              "token": "aW50ZXJhY3Rpb246MTMwMDAwMDAwMDAwMDAwMDAwMTpmYWtl", "type": 2, "version": 1})
    kind_set("discord", name="APPLICATION_COMMAND interaction", source=src, secrets=[pub], sign_key=sk,
             wrong_key=other, body=cmd, tamper=('"name":"ping"', '"name":"pong"'), sign=sign, verify=verify,
             event_ids=["1300000000000000001"], event_types=["2"], sig_headers=["X-Signature-Ed25519"],
             tolerance=300, pk=pem)


# ---------------------------------------------------------------- square

def gen_square():
    from square.utils.webhooks_helper import verify_signature
    src = f"signed by hand (the SDK has no signer); verified with {pyv('squareup')} square.utils.webhooks_helper.verify_signature"

    def sign(k, body, ts, u, q):
        return {"headers": [["x-square-hmacsha256-signature", hmac_b64(k, u + body)]]}

    def verify(req, secrets, now):
        sig = hget(req, "x-square-hmacsha256-signature")
        if sig is None:
            return False
        return any(verify_signature(request_body=req["body"], signature_header=sig, signature_key=s,
                                    notification_url=full_url(req)) for s in secrets)

    body = cj({"merchant_id": "6SSW7HV8K2ST5", "type": "payment.updated", "event_id": "13b867cf-db3d-4b1c-90b6-2f32a9d78124",
               "created_at": "2025-11-30T00:00:00.000Z",
               "data": {"type": "payment", "id": "KkAkhdMsgzn59SM8A89WgKwekxLZY",
                        "object": {"payment": {"id": "KkAkhdMsgzn59SM8A89WgKwekxLZY", "amount_money": {"amount": 100, "currency": "USD"},
                                               "status": "COMPLETED", "location_id": "NAQ1FHV6ZJ8YV", "version": 2}}}})
    kind_set("square", name="payment.updated", source=src, secrets=["8kRrUM3sFq1gT0PdQ7rXvA"], sign_key="8kRrUM3sFq1gT0PdQ7rXvA",
             wrong_key="Ibxx_5AKakO-3qeNVR61Dw", body=body, tamper=('"amount":100', '"amount":900'), sign=sign, verify=verify,
             event_ids=["13b867cf-db3d-4b1c-90b6-2f32a9d78124"], event_types=["payment.updated"],
             sig_headers=["x-square-hmacsha256-signature"], public_url="https://example.com/hooks/square")
    # the SDK's own test vectors (squareup's tests/ for utils.webhooks_helper)
    for name, body, sig, k, url, ids, types in [
        ("SDK test vector (GF4YkrJg...2N4=)",
         '{"merchant_id":"MLEFBHHSJGVHD","type":"webhooks.test_notification","event_id":"ac3ac95b-f97d-458c-a6e6-18981597e05f","created_at":"2022-07-13T20:30:59.037339943Z","data":{"type":"webhooks","id":"bc368e64-01aa-407e-b46e-3231809b1129"}}',
         "GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4=", "Ibxx_5AKakO-3qeNVR61Dw",
         "https://webhook.site/679a4f3a-dcfa-49ee-bac5-9d0edad886b9", ["ac3ac95b-f97d-458c-a6e6-18981597e05f"],
         ["webhooks.test_notification"]),
        ("SDK test vector with > and < in the body (Cxt7...U4U=)", '{"data":{"type":"webhooks","id":">id<"}}',
         "Cxt7+aTi4rKgcA0bC4g9EHdVtLSDWdqccmL5MvihU4U=", "signature-key", "https://webhook.site/webhooks", None, None),
    ]:
        req = {"public_url": url, "method": "POST", "query": "",
               "headers": [["Content-Type", "application/json"], ["x-square-hmacsha256-signature", sig]], "body": body}
        v = verify(req, [k], NOW)
        assert v, name
        emit("square", name, f"{pyv('squareup')} webhooks_helper.verify_signature; vector from the Square SDKs' webhooks helper tests",
             [k], req, v, None, ids, types)


# ---------------------------------------------------------------- hubspot

def gen_hubspot():
    from hubspot.utils.signature import Signature
    src = f"{pyv('hubspot-api-client')} Signature.get_signature / is_valid"
    secret = "c5b0e0d8-6f4a-4d1e-9a7b-3f2e1d0c9b8a"

    def sign(k, body, ts, u, q):
        ms = str(ts * 1000)
        sig = Signature.get_signature(k, body, "v3", http_uri=u + ("?" + q if q else ""), http_method="POST", timestamp=ms)
        return {"headers": [["X-HubSpot-Signature-v3", sig], ["X-HubSpot-Request-Timestamp", ms]]}

    def verify(req, secrets, now):
        sig, ts = hget(req, "X-HubSpot-Signature-v3"), hget(req, "X-HubSpot-Request-Timestamp")
        if sig is None:
            return False
        with frozen(now):
            def one(s):
                try:
                    return Signature.is_valid(sig, s, req["body"], full_url(req), req["method"], "v3", ts)
                except Exception:
                    return False
            return any(one(s) for s in secrets)

    items = [
        {"eventId": 1001, "subscriptionId": 2001, "portalId": 62515, "appId": 3001, "occurredAt": (NOW - 5) * 1000,
         "subscriptionType": "contact.propertyChange", "attemptNumber": 0, "objectId": 123, "propertyName": "email",
         "propertyValue": "alice@example.com", "changeSource": "CRM_UI"},
        {"eventId": 1002, "subscriptionId": 2002, "portalId": 62515, "appId": 3001, "occurredAt": (NOW - 4) * 1000,
         "subscriptionType": "contact.creation", "attemptNumber": 0, "objectId": 124, "changeSource": "CRM_UI"},
        {"eventId": 1003, "subscriptionId": 2003, "portalId": 62515, "appId": 3001, "occurredAt": (NOW - 3) * 1000,
         "subscriptionType": "deal.deletion", "attemptNumber": 0, "objectId": 987, "changeSource": "CRM_UI"},
    ]
    body = cj(items)
    kind_set("hubspot", name="v3 batch of 3", source=src + " (v3; is_valid checks the past only)", secrets=[secret],
             sign_key=secret, wrong_key="00000000-0000-0000-0000-000000000000", body=body,
             tamper=('"objectId":124', '"objectId":125'), sign=sign, verify=verify, event_ids=None,
             event_types=[i["subscriptionType"] for i in items], sig_headers=["X-HubSpot-Signature-v3"],
             tolerance=300, public_url="https://example.com/hooks/hubspot", query="portal=62515")
    one = cj(items[:1])
    kind_set("hubspot", name="v3 single event, no query", source=src + " (v3)", secrets=[secret], sign_key=secret,
             wrong_key="00000000-0000-0000-0000-000000000000", body=one, tamper=('"objectId":123', '"objectId":124'),
             sign=sign, verify=verify, event_ids=None, event_types=["contact.propertyChange"], sig_headers=[],
             public_url="https://example.com/hooks/hubspot")

    # legacy v2 / v1
    for ver_ in ("v2", "v1"):
        def sign_l(k, body, ts, u, q, ver_=ver_):
            sig = Signature.get_signature(k, body, ver_, http_uri=(u or "") + ("?" + q if q else ""), http_method="POST")
            return {"headers": [["X-HubSpot-Signature", sig], ["X-HubSpot-Signature-Version", ver_]]}

        def verify_l(req, secrets, now, ver_=ver_):
            sig = hget(req, "X-HubSpot-Signature")
            if sig is None:
                return False
            return any(Signature.is_valid(sig, s, req["body"], full_url(req), req["method"], hget(req, "X-HubSpot-Signature-Version"))
                       for s in secrets)
        kind_set("hubspot", name=f"{ver_} legacy signature", source=src + f" ({ver_})", secrets=[secret], sign_key=secret,
                 wrong_key="00000000-0000-0000-0000-000000000000", body=body, tamper=('"objectId":124', '"objectId":125'),
                 sign=sign_l, verify=verify_l, event_ids=None, event_types=[i["subscriptionType"] for i in items],
                 sig_headers=["X-HubSpot-Signature"], public_url="https://example.com/hooks/hubspot" if ver_ == "v2" else None)


# ---------------------------------------------------------------- razorpay

def gen_razorpay():
    import razorpay
    src = f"signed by hand; verified with {pyv('razorpay')} Utility.verify_webhook_signature"
    client = razorpay.Client(auth=("rzp_test_key", "rzp_test_secret"))

    def sign(k, body, ts, u, q):
        return {"headers": [["X-Razorpay-Signature", hmac_hex(k, body)], ["X-Razorpay-Event-Id", "GGnPlj1LzOHO7k"]]}

    def verify(req, secrets, now):
        sig = hget(req, "X-Razorpay-Signature")
        return sig is not None and any(raises_not(client.utility.verify_webhook_signature, req["body"], sig, s) for s in secrets)

    body = cj({"entity": "event", "account_id": "acc_BFQ7uQEaa7j2z7", "event": "payment.captured", "contains": ["payment"],
               "payload": {"payment": {"entity": {"id": "pay_DESlfW9H8K9uqM", "entity": "payment", "amount": 100,
                                                  "currency": "INR", "status": "captured", "order_id": "order_DESlLckIVRkHWj",
                                                  "method": "card", "captured": True, "created_at": NOW - 60}}},
               "created_at": NOW})
    kind_set("razorpay", name="payment.captured", source=src, secrets=["rzp_whsec_0123456789"], sign_key="rzp_whsec_0123456789",
             wrong_key="rzp_whsec_other", body=body, tamper=('"amount":100', '"amount":10000'), sign=sign, verify=verify,
             event_ids=["GGnPlj1LzOHO7k"], event_types=["payment.captured"], sig_headers=["X-Razorpay-Signature"])


# ---------------------------------------------------------------- adyen

def gen_adyen():
    from Adyen.util import generate_notification_sig, is_valid_hmac_notification
    src = f"{pyv('Adyen')} util.generate_notification_sig / is_valid_hmac_notification (per item)"
    key = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"
    wrong = "A4782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA057"

    def items_body(items, k):
        out = []
        for it in items:
            it = copy.deepcopy(it)
            sig = generate_notification_sig(it, k).decode()
            it.setdefault("additionalData", {})["hmacSignature"] = sig
            out.append({"NotificationRequestItem": it})
        return json.dumps({"live": "false", "notificationItems": out})

    def sign(k, body, ts, u, q):
        return {"headers": [], "body": items_body(json.loads(body), k)}

    def verify(req, secrets, now):
        try:
            d = json.loads(req["body"])
            its = [x["NotificationRequestItem"] for x in d["notificationItems"]]
        except Exception:
            return False
        return all(any(bool(is_valid_hmac_notification(it, s)) for s in secrets) for it in its)

    items = [
        {"amount": {"currency": "EUR", "value": 1130}, "eventCode": "AUTHORISATION", "eventDate": "2025-11-30T00:00:00+01:00",
         "merchantAccountCode": "TestMerchant", "merchantReference": "order-1001", "paymentMethod": "visa",
         "pspReference": "QFQTPCQ8HXSKGK82", "success": "true", "additionalData": {"authCode": "058705"}},
        {"amount": {"currency": "EUR", "value": 1130}, "eventCode": "CAPTURE", "eventDate": "2025-11-30T00:00:05+01:00",
         "merchantAccountCode": "TestMerchant", "merchantReference": "order-1001", "originalReference": "QFQTPCQ8HXSKGK82",
         "paymentMethod": "visa", "pspReference": "LNFZJK8QMZ5BTN82", "success": "true"},
        {"amount": {"currency": "USD", "value": 500}, "eventCode": "REFUND", "eventDate": "2025-11-30T00:00:09+01:00",
         "merchantAccountCode": "TestMerchant", "merchantReference": "order-0999", "originalReference": "V4HZ4RBFJGXXGN82",
         "paymentMethod": "mc", "pspReference": "ZX7WQKB3MD2FTR82", "reason": "", "success": "false"},
    ]
    kind_set("adyen", name="standard notification, 3 items", source=src, secrets=[key], sign_key=key, wrong_key=wrong,
             body=json.dumps(items), tamper=('"value": 500', '"value": 50000'), sign=sign, verify=verify, event_ids=None,
             event_types=[i["eventCode"] for i in items], sig_headers=[])
    # one item right, one item signed with another key: the whole batch is refused
    good = json.loads(items_body(items[:1], key))["notificationItems"]
    bad = json.loads(items_body(items[1:2], wrong))["notificationItems"]
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"]],
           "body": json.dumps({"live": "false", "notificationItems": good + bad})}
    emit("adyen", "batch with one item signed by another key", src, [key], req, verify(req, [key], NOW), "wrong_secret")
    # Adyen's documentation vector
    doc = {"pspReference": "7914073381342284", "originalReference": "", "merchantAccountCode": "TestMerchant",
           "merchantReference": "TestPayment-1407325143704", "amount": {"value": 1130, "currency": "EUR"},
           "eventCode": "AUTHORISATION", "success": "true", "eventDate": "2019-05-06T17:15:34.121+02:00",
           "operations": ["CANCEL", "CAPTURE", "REFUND"], "paymentMethod": "visa", "reason": "033899:1111:03/2030"}
    sig = generate_notification_sig(doc, key).decode()
    assert sig == "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0=", sig
    body = json.dumps({"live": "false", "notificationItems": [{"NotificationRequestItem": dict(doc, additionalData={"hmacSignature": sig})}]})
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"]], "body": body}
    emit("adyen", "Adyen docs vector (coqCmt/IZ4E...Wo0=)", src + "; Adyen docs 'Verify HMAC signatures' example", [key], req,
         verify(req, [key], NOW), None, None, ["AUTHORISATION"])


# ---------------------------------------------------------------- gocardless

def gen_gocardless():
    from gocardless_pro import webhooks
    src = f"signed by hand; verified with {pyv('gocardless-pro')} webhooks.parse"

    def sign(k, body, ts, u, q):
        return {"headers": [["Webhook-Signature", hmac_hex(k, body)], ["Origin", "https://api.gocardless.com"]]}

    def verify(req, secrets, now):
        sig = hget(req, "Webhook-Signature")
        return sig is not None and any(raises_not(webhooks.parse, req["body"], s, sig) for s in secrets)

    events = [
        {"id": "EV00BD05S5VM2T", "created_at": "2025-11-30T00:00:00.000Z", "resource_type": "payments", "action": "confirmed",
         "links": {"payment": "PM0006B8AB6C2Z"}, "details": {"origin": "gocardless", "cause": "payment_confirmed",
                                                              "description": "Enough time has passed since the payment was submitted for the banks to return an error, so this payment is now confirmed."},
         "metadata": {}, "resource_metadata": {}},
        {"id": "EV00BD05TB8K63", "created_at": "2025-11-30T00:00:00.000Z", "resource_type": "mandates", "action": "cancelled",
         "links": {"mandate": "MD000AMA19XGEC"}, "details": {"origin": "bank", "cause": "bank_account_closed",
                                                              "description": "The customer's bank account was closed."},
         "metadata": {}, "resource_metadata": {}},
    ]
    body = cj({"events": events, "meta": {"webhook_id": "WB0009WQ0FY4SH"}})
    kind_set("gocardless", name="two events", source=src, secrets=["gc_endpoint_secret_0123"], sign_key="gc_endpoint_secret_0123",
             wrong_key="gc_endpoint_secret_other", body=body, tamper=('"confirmed"', '"failed"'), sign=sign, verify=verify,
             event_ids=[e["id"] for e in events], event_types=[e["resource_type"] + "." + e["action"] for e in events],
             sig_headers=["Webhook-Signature"])


# ---------------------------------------------------------------- box

def gen_box():
    from box_sdk_gen.internal.utils import compute_webhook_signature
    from box_sdk_gen.managers.webhooks import WebhooksManager
    src = f"{pyv('box-sdk-gen')} compute_webhook_signature / WebhooksManager.validate_message"
    primary, secondary = "SamplePrimaryKey0123456789abcdef", "SampleSecondaryKeyfedcba987654321"

    def mk_sign(escape=False, sec_key=None):
        def sign(keys, body, ts, u, q):
            p, s = keys
            h = {"box-delivery-id": "f96bb54b-ee16-4fc5-aa65-8c2d9e5b546f",
                 "box-delivery-timestamp": rfc3339(ts, -8),
                 "box-signature-algorithm": "HmacSHA256", "box-signature-version": "1"}
            hp = compute_webhook_signature(body, h, p, escape_body=escape)
            hs = compute_webhook_signature(body, h, s, escape_body=escape)
            return {"headers": [["BOX-DELIVERY-ID", h["box-delivery-id"]], ["BOX-DELIVERY-TIMESTAMP", h["box-delivery-timestamp"]],
                                ["BOX-SIGNATURE-ALGORITHM", "HmacSHA256"], ["BOX-SIGNATURE-PRIMARY", hp],
                                ["BOX-SIGNATURE-SECONDARY", hs], ["BOX-SIGNATURE-VERSION", "1"]]}
        return sign

    def verify(req, secrets, now):
        with frozen(now):
            return WebhooksManager.validate_message(req["body"], hdict(req), secrets[0],
                                                    secondary_key=secrets[1] if len(secrets) > 1 else None)

    def body_for(name):
        return cj({"type": "webhook_event", "id": "eac4a6e3-b5f6-4d3e-9d1e-6a3b2c1d0e9f", "created_at": rfc3339(NOW - 2, -8),
                   "trigger": "FILE.UPLOADED", "webhook": {"id": "12345", "type": "webhook"},
                   "created_by": {"type": "user", "id": "2030392653", "name": "Alice", "login": "alice@example.com"},
                   "source": {"id": "1234567890", "type": "file", "name": name, "sha1": "a2f6f9a0b4c4d2c1e0f9d8c7b6a5f4e3d2c1b0a9",
                              "parent": {"type": "folder", "id": "0", "name": "All Files"}}})
    body = body_for("report.pdf")
    kind_set("box", name="FILE.UPLOADED", source=src, secrets=[primary, secondary], sign_key=(primary, secondary),
             wrong_key=("WrongPrimaryKey", "WrongSecondaryKey"), body=body, tamper=('report.pdf', 'report.exe'),
             sign=mk_sign(), verify=verify, event_ids=["eac4a6e3-b5f6-4d3e-9d1e-6a3b2c1d0e9f"], event_types=["FILE.UPLOADED"],
             sig_headers=["BOX-SIGNATURE-PRIMARY", "BOX-SIGNATURE-SECONDARY"], tolerance=600, future=True,
             window_note="validate_message: 10 min max age, any future timestamp refused")
    # primary signed with an old key, secondary right (rotation)
    g = mk_sign()((primary, secondary), body, NOW, None, "")
    w = mk_sign()(("RotatedAwayPrimaryKey", secondary), body, NOW, None, "")
    hdrs = [h if h[0] != "BOX-SIGNATURE-PRIMARY" else dict((k, [k, v]) for k, v in w["headers"])["BOX-SIGNATURE-PRIMARY"]
            for h in g["headers"]]
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"]] + hdrs, "body": body}
    emit("box", "primary signature from an old key, secondary right", src, [primary, secondary], req, verify(req, [primary, secondary], NOW),
         "second_signature_wrong", ["eac4a6e3-b5f6-4d3e-9d1e-6a3b2c1d0e9f"], ["FILE.UPLOADED"])
    # 30 s in the future: validate_message refuses any future timestamp
    f = mk_sign()((primary, secondary), body, NOW + 30, None, "")
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"]] + f["headers"], "body": body}
    emit("box", "FILE.UPLOADED: timestamp 30 s ahead", src + "; any future timestamp refused", [primary, secondary], req,
         verify(req, [primary, secondary], NOW), "future_timestamp")
    # non-ASCII body signed over its \\uXXXX-escaped form
    ubody = body_for("Résumé – 2025.pdf")
    e = mk_sign(escape=True)((primary, secondary), ubody, NOW, None, "")
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"]] + e["headers"], "body": ubody}
    v = verify(req, [primary, secondary], NOW)
    assert v
    emit("box", "non-ASCII body signed over its \\uXXXX-escaped text", src + " (escape_body=True)", [primary, secondary], req, v, None,
         ["eac4a6e3-b5f6-4d3e-9d1e-6a3b2c1d0e9f"], ["FILE.UPLOADED"])
    e = mk_sign(escape=False)((primary, secondary), ubody, NOW, None, "")
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"]] + e["headers"], "body": ubody}
    v = verify(req, [primary, secondary], NOW)
    assert v
    emit("box", "non-ASCII body signed over its raw UTF-8", src, [primary, secondary], req, v, None,
         ["eac4a6e3-b5f6-4d3e-9d1e-6a3b2c1d0e9f"], ["FILE.UPLOADED"])


# ---------------------------------------------------------------- mailgun

def gen_mailgun():
    from mailgun.security import SecurityGuard
    src = f"signed by hand; verified with {pyv('mailgun')} SecurityGuard.verify_webhook (max_age_seconds=900)"
    token = "5d2a8b3c9e1f4a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a"

    def sign(k, body, ts, u, q):
        d = json.loads(body)
        d = {"signature": {"token": token, "timestamp": str(ts), "signature": hmac_hex(k, str(ts) + token)}, **d}
        return {"headers": [], "body": json.dumps(d)}

    def verify(req, secrets, now):
        try:
            s = json.loads(req["body"])["signature"]
        except Exception:
            return False
        with frozen(now):
            return any(raises_not(SecurityGuard.verify_webhook, k, s["token"], s["timestamp"], s["signature"]) for k in secrets)

    body = json.dumps({"event-data": {"id": "CPgfbmQMTCKtHW6uIWtuVe", "timestamp": NOW - 3.5, "log-level": "info", "event": "delivered",
                                      "recipient": "alice@example.com", "recipient-domain": "example.com",
                                      "message": {"headers": {"message-id": "20251130000000.1.ABCDEF@mg.example.com",
                                                              "from": "Acme <noreply@mg.example.com>", "to": "alice@example.com",
                                                              "subject": "Welcome"}},
                                      "delivery-status": {"code": 250, "message": "OK", "attempt-no": 1},
                                      "user-variables": {}}})
    kind_set("mailgun", name="delivered", source=src, secrets=["key-0123456789abcdef0123456789abcdef"],
             sign_key="key-0123456789abcdef0123456789abcdef", wrong_key="key-ffffffffffffffffffffffffffffffff", body=body,
             tamper=('"delivered"', '"failed"'), sign=sign, verify=verify, event_ids=["CPgfbmQMTCKtHW6uIWtuVe"],
             event_types=["delivered"], sig_headers=[], tolerance=900, future=True)


# ---------------------------------------------------------------- gitlab / okta / postmark / msgraph (shared secrets)

def eq_any(v, secrets):
    return v is not None and any(hmac.compare_digest(v.encode(), s.encode()) for s in secrets)


def gen_gitlab():
    src = "hand signer (docs: GitLab 'Webhooks', X-Gitlab-Token; no library)"

    def sign(k, body, ts, u, q):
        return {"headers": [["User-Agent", "GitLab/17.6.0"], ["X-Gitlab-Event", "Push Hook"], ["X-Gitlab-Token", k],
                            ["X-Gitlab-Instance", "https://gitlab.example.com"],
                            ["X-Gitlab-Webhook-UUID", "16a7ff38-1ef8-4f54-9a1d-8a0e3e2f1b9c"],
                            ["X-Gitlab-Event-UUID", "8a5e9b46-2c1d-4f0e-9b8a-7c6d5e4f3a2b"],
                            ["Idempotency-Key", "3f1c2b4a-5d6e-4f70-8a9b-0c1d2e3f4a5b"]]}

    def verify(req, secrets, now):
        return eq_any(hget(req, "X-Gitlab-Token"), secrets)

    body = cj({"object_kind": "push", "event_name": "push", "before": "95790bf891e76fee5e1747ab589903a6a1f80f22",
               "after": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7", "ref": "refs/heads/main", "checkout_sha": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7",
               "user_id": 4, "user_name": "Alice", "user_username": "alice", "project_id": 15,
               "project": {"id": 15, "name": "Diaspora", "path_with_namespace": "mike/diaspora", "default_branch": "main"},
               "commits": [{"id": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7", "message": "fixed readme", "timestamp": "2025-11-30T00:00:00+00:00"}],
               "total_commits_count": 1})
    kind_set("gitlab", name="Push Hook", source=src, secrets=["glpat-webhook-token-0123"], sign_key="glpat-webhook-token-0123",
             wrong_key="glpat-webhook-token-wrong", body=body, tamper=('fixed readme', 'broke readme'), sign=sign, verify=verify,
             event_ids=["3f1c2b4a-5d6e-4f70-8a9b-0c1d2e3f4a5b"], event_types=["Push Hook"], sig_headers=["X-Gitlab-Token"])


def gen_okta():
    src = "hand signer (docs: Okta 'Event hooks', authScheme header; no library)"
    secret = "Bearer okta-event-hook-secret-0123456789"

    def sign(k, body, ts, u, q):
        return {"headers": [["Authorization", k], ["User-Agent", "Okta Event Hooks"]]}

    def verify(req, secrets, now):
        return eq_any(hget(req, "Authorization"), secrets)

    evs = [{"uuid": "4a3c1e5e-cd1b-11ef-8c4f-a1b2c3d4e5f6", "published": "2025-11-29T23:59:58.000Z", "eventType": "user.session.start",
            "version": "0", "displayMessage": "User login to Okta", "severity": "INFO",
            "actor": {"id": "00u1a2b3c4d5e6f7g8h9", "type": "User", "alternateId": "alice@example.com", "displayName": "Alice"},
            "outcome": {"result": "SUCCESS"}},
           {"uuid": "4b7d2f6a-cd1b-11ef-8c4f-a1b2c3d4e5f6", "published": "2025-11-29T23:59:59.000Z", "eventType": "user.lifecycle.create",
            "version": "0", "displayMessage": "Create okta user", "severity": "INFO",
            "actor": {"id": "00u0admin0000000000", "type": "User", "alternateId": "admin@example.com", "displayName": "Admin"},
            "outcome": {"result": "SUCCESS"}}]
    body = cj({"eventType": "com.okta.event_hook", "eventTypeVersion": "1.0", "cloudEventsVersion": "0.1",
               "source": "https://example.okta.com/api/v1/eventHooks/whoabc123", "eventId": "b5a188b9-5ece-4636-b041-482ffda96311",
               "data": {"events": evs}, "eventTime": "2025-11-30T00:00:00.000Z", "contentType": "application/json"})
    kind_set("okta", name="two events", source=src, secrets=[secret], sign_key=secret, wrong_key="Bearer wrong",
             body=body, tamper=('"SUCCESS"', '"FAILURE"'), sign=sign, verify=verify, event_ids=[e["uuid"] for e in evs],
             event_types=[e["eventType"] for e in evs], sig_headers=["Authorization"])


def gen_postmark():
    src = "hand signer (docs: Postmark 'Webhooks overview', HTTP Basic auth; no library)"

    def sign(k, body, ts, u, q):
        return {"headers": [["Authorization", "Basic " + base64.b64encode(k.encode()).decode()]]}

    def verify(req, secrets, now):
        a = hget(req, "Authorization")
        if not a or not a.startswith("Basic "):
            return False
        try:
            creds = base64.b64decode(a[6:], validate=True).decode()
        except Exception:
            return False
        return eq_any(creds, secrets)

    body = json.dumps({"RecordType": "Delivery", "ServerID": 23, "MessageStream": "outbound",
                       "MessageID": "00000000-0000-0000-0000-000000000000", "Recipient": "john@example.com", "Tag": "welcome-email",
                       "DeliveredAt": "2025-11-29T23:59:59Z", "Details": "Test delivery webhook details", "Metadata": {"a_key": "a_value"}})
    kind_set("postmark", name="Delivery", source=src, secrets=["hookuser:s3cr3t-pass"], sign_key="hookuser:s3cr3t-pass",
             wrong_key="hookuser:wrong", body=body, tamper=('"Delivery"', '"Bounce"'), sign=sign, verify=verify,
             event_ids=None, event_types=["Delivery"], sig_headers=["Authorization"])


def gen_msgraph():
    src = "hand signer (docs: Microsoft Graph 'Receive change notifications through webhooks', clientState; no library)"

    def sign(k, body, ts, u, q):
        d = json.loads(body)
        for it in d["value"]:
            it["clientState"] = k
        return {"headers": [], "body": json.dumps(d)}

    def verify(req, secrets, now):
        try:
            its = json.loads(req["body"])["value"]
        except Exception:
            return False
        return bool(its) and all(eq_any(it.get("clientState"), secrets) for it in its)

    def item(i, change, res_id):
        return {"id": f"lsgTZMr9KwAAA{i}", "subscriptionId": "7f105c7d-2dc5-4530-97cd-4e7ae6534c07",
                "subscriptionExpirationDateTime": "2025-12-02T00:00:00.0000000+00:00", "changeType": change,
                "resource": f"Users/4c0b4f4b-8a1e-4c0d-9c3a-2f1e0d9c8b7a/Messages/{res_id}",
                "resourceData": {"@odata.type": "#Microsoft.Graph.Message", "@odata.id": f"Users/4c0b4f4b/Messages/{res_id}",
                                 "@odata.etag": "W/\"CQAAABYAAACQ2fKdhq8oSKEDSVrdi3lRAAAGxl2h\"", "id": res_id},
                "tenantId": "84bd8158-6d4d-4958-8b9f-9d6445542f95"}
    its = [item(1, "created", "AAMkAGUwNjQ4ZjIxAAA="), item(2, "updated", "AAMkAGUwNjQ4ZjIxAAB="), item(3, "deleted", "AAMkAGUwNjQ4ZjIxAAC=")]
    body = json.dumps({"value": its})
    secret = "SecretClientState-9b1c2d"
    kind_set("msgraph", name="three change notifications", source=src, secrets=[secret], sign_key=secret, wrong_key="OtherClientState",
             body=body, tamper=('"deleted"', '"updated"'), sign=sign, verify=verify, event_ids=[i["id"] for i in its],
             event_types=[i["changeType"] for i in its], sig_headers=[])
    # one item with a wrong clientState: the delivery is refused
    d = json.loads(sign(secret, body, NOW, None, "")["body"])
    d["value"][1]["clientState"] = "OtherClientState"
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"]], "body": json.dumps(d)}
    emit("msgraph", "one of three items with a wrong clientState", src, [secret], req, verify(req, [secret], NOW), "wrong_secret")
    # a lifecycle notification
    lc = {"subscriptionId": "7f105c7d-2dc5-4530-97cd-4e7ae6534c07", "subscriptionExpirationDateTime": "2025-12-02T00:00:00.0000000+00:00",
          "tenantId": "84bd8158-6d4d-4958-8b9f-9d6445542f95", "clientState": secret, "lifecycleEvent": "reauthorizationRequired"}
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"]], "body": json.dumps({"value": [lc]})}
    emit("msgraph", "lifecycle notification (no id)", src, [secret], req, verify(req, [secret], NOW), None, None, ["reauthorizationRequired"])


# ---------------------------------------------------------------- octokit-signed kinds: bitbucket, meta

def gen_bitbucket_meta():
    osrc = NODE.version("@octokit/webhooks-methods")

    def sign_hub(header):
        def sign(k, body, ts, u, q):
            h = {"X-Hub-Signature": [["X-Event-Key", "repo:push"], ["X-Request-UUID", "a7c1b6e2-4d3f-4e8a-9b0c-1d2e3f4a5b6c"],
                                     ["X-Hook-UUID", "2b6f0c1e-7a8d-4e9f-b0a1-c2d3e4f5a6b7"], ["User-Agent", "Bitbucket-Webhooks/2.0"]],
                 "X-Hub-Signature-256": []}[header]
            return {"headers": h + [[header, NODE("octokit.sign", secret=k, payload=body)]]}
        return sign

    def verify_hub(header):
        def verify(req, secrets, now):
            sig = hget(req, header)
            return sig is not None and any(NODE("octokit.verify", secret=s, payload=req["body"], signature=sig) for s in secrets)
        return verify

    src = f"{osrc} sign / verify (same construction as Bitbucket's; no Bitbucket library)"
    body = cj({"push": {"changes": [{"new": {"type": "branch", "name": "main", "target": {"hash": "709d658dc5b6d6afcd46049c2f332ee3f515a67d"}},
                                     "old": {"type": "branch", "name": "main", "target": {"hash": "1e65c05c1d5171631d92438a13901ca7dae9618c"}},
                                     "created": False, "forced": False, "closed": False}]},
               "repository": {"type": "repository", "full_name": "acme/widgets", "uuid": "{d8c6f0a2-3b4e-4c5d-8e9f-0a1b2c3d4e5f}"},
               "actor": {"type": "user", "display_name": "Alice", "uuid": "{0f1e2d3c-4b5a-4968-8776-655443322110}"}})
    kind_set("bitbucket", name="repo:push", source=src, secrets=["bb-webhook-secret"], sign_key="bb-webhook-secret",
             wrong_key="bb-webhook-wrong", body=body, tamper=('"forced":false', '"forced":true'), sign=sign_hub("X-Hub-Signature"),
             verify=verify_hub("X-Hub-Signature"), event_ids=["a7c1b6e2-4d3f-4e8a-9b0c-1d2e3f4a5b6c"], event_types=["repo:push"],
             sig_headers=["X-Hub-Signature"])
    # GitHub's documentation vector, carried in Bitbucket's header
    sig = NODE("octokit.sign", secret="It's a Secret to Everybody", payload="Hello, World!")
    assert sig == "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17", sig
    req = {"public_url": None, "method": "POST", "query": "",
           "headers": [["Content-Type", "text/plain"], ["X-Event-Key", "repo:push"],
                       ["X-Request-UUID", "0b5d6e7f-8091-4a2b-8c3d-4e5f60718293"], ["X-Hub-Signature", sig]],
           "body": "Hello, World!"}
    emit("bitbucket", "GitHub docs vector (sha256=757107ea...3e17)", src + "; GitHub docs 'Validating webhook deliveries' example",
         ["It's a Secret to Everybody"], req, verify_hub("X-Hub-Signature")(req, ["It's a Secret to Everybody"], NOW), None,
         ["0b5d6e7f-8091-4a2b-8c3d-4e5f60718293"], ["repo:push"])

    msrc = f"{osrc} sign / verify (same construction as Meta's X-Hub-Signature-256; no Meta library)"
    body = cj({"object": "whatsapp_business_account", "entry": [{"id": "102290129340398", "changes": [{"value": {
        "messaging_product": "whatsapp", "metadata": {"display_phone_number": "15550783881", "phone_number_id": "106540352242922"},
        "contacts": [{"profile": {"name": "Sheena Nelson"}, "wa_id": "16505551234"}],
        "messages": [{"from": "16505551234", "id": "wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQTRBNjU5OUFFRTAzODEwMTQ0RgA=",
                      "timestamp": str(NOW - 2), "text": {"body": "Does it come in another color?"}, "type": "text"}]},
        "field": "messages"}]}]})
    kind_set("meta", name="WhatsApp message", source=msrc, secrets=["meta-app-secret-0123456789abcdef"],
             sign_key="meta-app-secret-0123456789abcdef", wrong_key="meta-app-secret-wrong", body=body,
             tamper=('another color', 'another size'), sign=sign_hub("X-Hub-Signature-256"), verify=verify_hub("X-Hub-Signature-256"),
             event_ids=[sha256_hex(body)], event_types=["whatsapp_business_account"], sig_headers=["X-Hub-Signature-256"])


# ---------------------------------------------------------------- zoom

def gen_zoom():
    from slack_sdk.signature import SignatureVerifier

    class Clock:
        def __init__(self, now):
            self.t = now

        def now(self):
            return float(self.t)

    rsrc = NODE.version("@zoom/rivet")
    src = (f"signed with {pyv('slack-sdk')} SignatureVerifier.generate_signature (v0:ts:body, identical); verified with "
           f"{rsrc} AwsLambdaReceiver (CommonHttpRequest.isEventVerified) and slack_sdk is_valid (5 min window)")

    def sign(k, body, ts, u, q):
        return {"headers": [["x-zm-request-timestamp", str(ts)],
                            ["x-zm-signature", SignatureVerifier(k).generate_signature(timestamp=str(ts), body=body)],
                            ["x-zm-trackingid", "v=2.0;clid=aw1;rid=WEB_0123456789abcdef"]]}

    def verify(req, secrets, now):
        ts, sig = hget(req, "x-zm-request-timestamp"), hget(req, "x-zm-signature")
        if ts is None or sig is None:
            return False
        riv = any(NODE("rivet.verify", body=req["body"], headers=hdict(req), secret=s)["ok"] for s in secrets)
        sl = any(SignatureVerifier(s, clock=Clock(now)).is_valid(req["body"], ts, sig) for s in secrets)
        if riv != sl:
            return sl, f"rivet answered {riv} (it checks no window), slack_sdk {sl}; valid from slack_sdk / PROVIDERS.md 5m"
        return sl

    body = cj({"event": "meeting.started", "event_ts": (NOW - 1) * 1000,
               "payload": {"account_id": "AAAAAABBBB", "object": {"id": "1234567890", "uuid": "4444AAAiAAAAAiAiAiiAii==",
                                                                  "host_id": "x1yCzABCDEfg23HiJKl4mN", "topic": "My Meeting", "type": 2,
                                                                  "start_time": "2025-11-29T23:59:59Z", "timezone": "America/Los_Angeles", "duration": 60}}})
    kind_set("zoom", name="meeting.started", source=src, secrets=["zoom_secret_token_0123"], sign_key="zoom_secret_token_0123",
             wrong_key="zoom_secret_token_wrong", body=body, tamper=('My Meeting', 'My Meetinf'), sign=sign, verify=verify,
             event_ids=None, event_types=["meeting.started"], sig_headers=["x-zm-signature"], tolerance=300, future=True)
    ub = cj({"payload": {"plainToken": "qgg8vlvZRS6UYooatFL8Aw"}, "event_ts": NOW * 1000, "event": "endpoint.url_validation"})
    g = sign("zoom_secret_token_0123", ub, NOW, None, "")
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"]] + g["headers"], "body": ub}
    r = NODE("rivet.verify", body=ub, headers=hdict(req), secret="zoom_secret_token_0123")
    expect = hmac_hex("zoom_secret_token_0123", "qgg8vlvZRS6UYooatFL8Aw")
    assert json.loads(r["body"]) == {"encryptedToken": expect, "plainToken": "qgg8vlvZRS6UYooatFL8Aw"}, r
    emit("zoom", "endpoint.url_validation (handshake, signed)",
         src + f"; rivet answers {{\"plainToken\":\"qgg8vlvZRS6UYooatFL8Aw\",\"encryptedToken\":\"{expect}\"}}",
         ["zoom_secret_token_0123"], req, verify(req, ["zoom_secret_token_0123"], NOW), None, None, ["endpoint.url_validation"])


# ---------------------------------------------------------------- simple HMAC-of-body kinds (hand signers)

def simple(kind, *, doc, header, fmt, body, secret, tamper, ids, types, extra=(), algo=hashlib.sha256, name):
    """fmt: 'hex', 'b64', or a prefix + ('hex'|'b64') like ('sha256=', 'hex')."""
    prefix, enc = fmt if isinstance(fmt, tuple) else ("", fmt)
    src = f"hand signer (docs: {doc})"

    def mac(k, b):
        return (hmac_hex if enc == "hex" else hmac_b64)(k, b, algo)

    def sign(k, b, ts, u, q):
        return {"headers": list(extra) + [[header, prefix + mac(k, b)]]}

    def verify(req, secrets, now):
        v = hget(req, header)
        return v is not None and any(hmac.compare_digest(v, prefix + mac(s, req["body"])) for s in secrets)

    kind_set(kind, name=name, source=src, secrets=[secret], sign_key=secret, wrong_key=secret + "-wrong", body=body, tamper=tamper,
             sign=sign, verify=verify, event_ids=ids, event_types=types, sig_headers=[header])


def gen_simple():
    # dropbox
    body = cj({"list_folder": {"accounts": ["dbid:AAH4f99T0taONIb-OurWxbNQ6ywGRopQngc", "dbid:AAB5yJfEIF2rwH4BgYCD1fWPuFJuvO3AJsw"]},
               "delta": {"users": [12345678, 23456789]}})
    simple("dropbox", doc="Dropbox 'Webhooks' reference", header="X-Dropbox-Signature", fmt="hex", body=body,
           secret="dropbox-app-secret-0123", tamper=("12345678", "12345679"), ids=[sha256_hex(body)], types=None,
           name="list_folder notification")
    # intercom
    body = cj({"type": "notification_event", "app_id": "abc123de", "data": {"type": "notification_event_data", "item": {
        "type": "conversation", "id": "147", "created_at": NOW - 10, "state": "open", "source": {"type": "conversation", "body": "<p>Hi</p>"}}},
        "links": {}, "id": "notif_ccd8a4d2-3d5f-4e8a-9a1b-7c6d5e4f3a2b", "topic": "conversation.user.created",
        "delivery_status": "pending", "delivery_attempts": 1, "delivered_at": 0, "first_sent_at": NOW, "created_at": NOW - 1, "self": None})
    simple("intercom", doc="Intercom 'Webhooks: signed notifications'", header="X-Hub-Signature", fmt=("sha1=", "hex"),
           algo=hashlib.sha1, body=body, secret="intercom-client-secret-0123", tamper=("<p>Hi</p>", "<p>Yo</p>"),
           ids=["notif_ccd8a4d2-3d5f-4e8a-9a1b-7c6d5e4f3a2b"], types=["conversation.user.created"], name="conversation.user.created")
    # typeform
    body = cj({"event_id": "01JDY2K3M4N5P6Q7R8S9T0V1W2", "event_type": "form_response", "form_response": {
        "form_id": "lT4Z3j", "token": "a3a12ec67a1365927098a606107fac15", "submitted_at": "2025-11-29T23:59:59Z",
        "landed_at": "2025-11-29T23:59:00Z", "definition": {"id": "lT4Z3j", "title": "Webhooks example", "fields": [
            {"id": "DlXFaesGBpoF", "title": "Your name?", "type": "short_text", "ref": "name"}]},
        "answers": [{"type": "text", "text": "Alice", "field": {"id": "DlXFaesGBpoF", "type": "short_text", "ref": "name"}}]}})
    simple("typeform", doc="Typeform 'Secure your webhooks'", header="Typeform-Signature", fmt=("sha256=", "b64"), body=body,
           secret="typeform-secret-0123", tamper=('"Alice"', '"Mallory"'), ids=["01JDY2K3M4N5P6Q7R8S9T0V1W2"], types=["form_response"],
           name="form_response")
    # lemonsqueezy
    body = cj({"meta": {"event_name": "order_created", "custom_data": {"customer_id": 25}},
               "data": {"type": "orders", "id": "1", "attributes": {"store_id": 1, "customer_id": 1, "identifier": "104e18a2-d755-4d4b-80c4-a6c1dcbe1c10",
                                                                     "order_number": 1, "total": 999, "currency": "USD", "status": "paid",
                                                                     "created_at": "2025-11-29T23:59:58.000000Z", "updated_at": "2025-11-29T23:59:59.000000Z"}}})
    simple("lemonsqueezy", doc="Lemon Squeezy 'Signing requests'", header="X-Signature", fmt="hex", body=body,
           secret="lemon-signing-secret-0123", tamper=('"total":999', '"total":1'), ids=None, types=["order_created"],
           extra=[["X-Event-Name", "order_created"]], name="order_created")
    # vercel
    body = cj({"id": "hook_aBcDeF0123456789", "type": "deployment.succeeded", "createdAt": (NOW - 1) * 1000, "region": "iad1",
               "payload": {"deployment": {"id": "dpl_2euZBFqxDXW6QF3AtVgbB9Kxy2xP", "name": "my-app", "url": "my-app-abc123.vercel.app"},
                           "project": {"id": "prj_12HKQaOmR5t5Uy6vdcQsNIiZgHGB"}, "team": {"id": "team_0123"}, "target": "production"}})
    simple("vercel", doc="Vercel 'Webhooks API'", header="x-vercel-signature", fmt="hex", algo=hashlib.sha1, body=body,
           secret="vercel-webhook-secret-0123", tamper=('"production"', '"preview"'), ids=["hook_aBcDeF0123456789"],
           types=["deployment.succeeded"], name="deployment.succeeded")
    # sentry
    body = cj({"action": "created", "installation": {"uuid": "a8e5d37a-696c-4c54-adb5-b3f28d64c7de"},
               "data": {"issue": {"id": "1170820242", "shortId": "PROJ-1", "title": "ZeroDivisionError: division by zero",
                                  "culprit": "app.views in divide", "level": "error", "status": "unresolved",
                                  "project": {"id": "1", "name": "backend", "slug": "backend"}}},
               "actor": {"type": "application", "id": "sentry", "name": "Sentry"}})
    simple("sentry", doc="Sentry integration platform 'Webhooks'", header="Sentry-Hook-Signature", fmt="hex", body=body,
           secret="sentry-client-secret-0123", tamper=('"error"', '"fatal"'), ids=["b3d5f7a9-1c2e-4f60-8a9b-0c1d2e3f4a5b"],
           types=["issue.created"], extra=[["Request-ID", "b3d5f7a9-1c2e-4f60-8a9b-0c1d2e3f4a5b"], ["Sentry-Hook-Resource", "issue"],
                                           ["Sentry-Hook-Timestamp", str(NOW)]], name="issue.created")
    # launchdarkly
    body = cj({"_links": {"canonical": {"href": "/api/v2/flags/default/alternate.page", "type": "application/json"}},
               "_id": "5c5f1b4a9c1b2b0e0f1d2c3b", "_accountId": "5a1b2c3d4e5f6a7b8c9d0e1f", "date": (NOW - 1) * 1000,
               "accesses": [{"action": "updateOn", "resource": "proj/default:env/production:flag/alternate.page"}],
               "kind": "flag", "name": "Alternate page", "description": "turned on the flag", "shortDescription": "",
               "member": {"_id": "5a1b2c3d4e5f6a7b8c9d0e20", "email": "alice@example.com"}, "titleVerb": "turned on the flag"})
    simple("launchdarkly", doc="LaunchDarkly 'Webhooks: signing'", header="X-LD-Signature", fmt="hex", body=body,
           secret="ld-webhook-secret-0123", tamper=('"updateOn"', '"updateOff"'), ids=["5c5f1b4a9c1b2b0e0f1d2c3b"], types=["flag"],
           name="flag updated")
    # asana: per-item text kept exactly as sent
    items = [cj({"user": {"gid": "1111", "resource_type": "user"}, "created_at": "2025-11-29T23:59:58.123Z", "action": "changed",
                 "resource": {"gid": "2222", "resource_type": "task", "resource_subtype": "default_task"},
                 "parent": None, "change": {"field": "completed", "action": "changed"}}),
             cj({"user": {"gid": "1111", "resource_type": "user"}, "created_at": "2025-11-29T23:59:59.456Z", "action": "added",
                 "resource": {"gid": "3333", "resource_type": "story", "resource_subtype": "comment_added"},
                 "parent": {"gid": "2222", "resource_type": "task", "resource_subtype": "default_task"}})]
    body = '{"events":[' + ",".join(items) + ']}'
    simple("asana", doc="Asana 'Webhooks'", header="X-Hook-Signature", fmt="hex", body=body, secret="asana-hook-secret-0123",
           tamper=('"completed"', '"name"'), ids=[sha256_hex(i) for i in items],
           types=[json.loads(i)["resource"]["resource_type"] + "." + json.loads(i)["action"] for i in items], name="two events")
    hb = '{"events":[]}'
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"],
                                                                         ["X-Hook-Signature", hmac_hex("asana-hook-secret-0123", hb)]], "body": hb}
    emit("asana", "heartbeat (no events)", "hand signer (docs: Asana 'Webhooks')", ["asana-hook-secret-0123"], req, True, None, [], [])


# ---------------------------------------------------------------- twitch

def gen_twitch():
    src = "hand signer (docs: Twitch EventSub 'Handling webhook events'; no library); 10 min window"
    mid = "befa7b53-d79d-478f-86b9-120f112b044e"

    def tstamp(ts):
        return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + ".634234626Z"

    def mk(mtype, sub):
        def sign(k, body, ts, u, q):
            t = tstamp(ts)
            return {"headers": [["Twitch-Eventsub-Message-Id", mid], ["Twitch-Eventsub-Message-Retry", "0"],
                                ["Twitch-Eventsub-Message-Type", mtype],
                                ["Twitch-Eventsub-Message-Signature", "sha256=" + hmac_hex(k, mid + t + body)],
                                ["Twitch-Eventsub-Message-Timestamp", t], ["Twitch-Eventsub-Subscription-Type", sub],
                                ["Twitch-Eventsub-Subscription-Version", "1"]]}
        return sign

    def verify(req, secrets, now):
        sig, t, i = (hget(req, "Twitch-Eventsub-Message-Signature"), hget(req, "Twitch-Eventsub-Message-Timestamp"),
                     hget(req, "Twitch-Eventsub-Message-Id"))
        if not (sig and t and i):
            return False
        ok = any(hmac.compare_digest(sig, "sha256=" + hmac_hex(s, i + t + req["body"])) for s in secrets)
        when = dt.datetime.strptime(t[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()
        return ok and now - when <= 600

    sub = {"id": "f1c2a387-161a-49f9-a165-0f21d7a4e1c4", "status": "enabled", "type": "channel.follow", "version": "2",
           "condition": {"broadcaster_user_id": "1337", "moderator_user_id": "1337"},
           "transport": {"method": "webhook", "callback": "https://example.com/hooks/twitch"}, "created_at": "2025-11-29T00:00:00.000000000Z", "cost": 0}
    body = cj({"subscription": sub, "event": {"user_id": "1234", "user_login": "cool_user", "user_name": "Cool_User",
                                              "broadcaster_user_id": "1337", "broadcaster_user_login": "cooler_user",
                                              "broadcaster_user_name": "Cooler_User", "followed_at": "2025-11-29T23:59:59.000000000Z"}})
    kind_set("twitch", name="channel.follow notification", source=src, secrets=["twitch-eventsub-secret-0123"],
             sign_key="twitch-eventsub-secret-0123", wrong_key="twitch-eventsub-wrong", body=body, tamper=('cool_user', 'cool_usex'),
             sign=mk("notification", "channel.follow"), verify=verify, event_ids=[mid], event_types=["channel.follow"],
             sig_headers=["Twitch-Eventsub-Message-Signature"], tolerance=600)
    vb = cj({"challenge": "pogchamp-kappa-360noscope-vohiyo", "subscription": dict(sub, status="webhook_callback_verification_pending")})
    g = mk("webhook_callback_verification", "channel.follow")("twitch-eventsub-secret-0123", vb, NOW, None, "")
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"]] + g["headers"], "body": vb}
    emit("twitch", "webhook_callback_verification (handshake, signed)", src + "; answer: the challenge as text/plain",
         ["twitch-eventsub-secret-0123"], req, verify(req, ["twitch-eventsub-secret-0123"], NOW), None, None, None)


# ---------------------------------------------------------------- t=,v1= kinds: calendly, persona, mux (stripe signer)

def gen_stripe_style():
    import stripe
    WS = stripe.WebhookSignature
    ssrc = f"{pyv('stripe')} WebhookSignature.generate_signature_header / verify_header"

    def sign_with(header):
        def sign(k, body, ts, u, q):
            return {"headers": [[header, WS.generate_signature_header(body, k, timestamp=ts)]]}
        return sign

    def verify_stripe(header, tol):
        def verify(req, secrets, now):
            h = hget(req, header)
            if not h:
                return False
            with frozen(now):
                return any(raises_not(WS.verify_header, req["body"], h, s, tolerance=tol) for s in secrets)
        return verify

    # calendly
    body = cj({"created_at": "2025-11-29T23:59:59.000000Z", "created_by": "https://api.calendly.com/users/AAAAAAAAAAAAAAAA",
               "event": "invitee.created", "payload": {"uri": "https://api.calendly.com/scheduled_events/GBGBDCAADAEDCRZ2/invitees/AAAAAAAAAAAAAAAA",
                                                      "email": "test@example.com", "name": "John Doe", "status": "active",
                                                      "event": "https://api.calendly.com/scheduled_events/GBGBDCAADAEDCRZ2",
                                                      "timezone": "America/New_York", "rescheduled": False}})
    kind_set("calendly", name="invitee.created", source=ssrc + " (identical t=,v1= construction; tolerance 180 s, past only)",
             secrets=["calendly-signing-key-0123"], sign_key="calendly-signing-key-0123", wrong_key="calendly-signing-key-wrong",
             body=body, tamper=('John Doe', 'Jane Doe'), sign=sign_with("Calendly-Webhook-Signature"),
             verify=verify_stripe("Calendly-Webhook-Signature", 180), event_ids=None, event_types=["invitee.created"],
             sig_headers=["Calendly-Webhook-Signature"], tolerance=180)

    # persona: rotation header "t=..,v1=.. t=..,v1=.."; Persona's docs split on the space first
    def verify_persona(req, secrets, now):
        h = hget(req, "Persona-Signature")
        if not h:
            return False
        with frozen(now):
            return any(raises_not(WS.verify_header, req["body"], grp, s, tolerance=300) for grp in h.split(" ") for s in secrets)
    psrc = ssrc + " (identical construction, tolerance 300 s); rotation header split on spaces per Persona's docs, each group verified by verify_header"
    body = cj({"data": {"type": "event", "id": "evt_XGuYWp2TEWYBs8YJt3pBbyNo", "attributes": {
        "name": "inquiry.completed", "created-at": "2025-11-29T23:59:59.000Z",
        "payload": {"data": {"type": "inquiry", "id": "inq_2CVZ4HyVg7qaboXz2ZMQhGRp", "attributes": {"status": "completed", "reference-id": "user-42"}}}}}})
    kind_set("persona", name="inquiry.completed", source=psrc, secrets=["wbhsec_persona_0123"], sign_key="wbhsec_persona_0123",
             wrong_key="wbhsec_persona_wrong", body=body, tamper=('"completed"', '"failed"'), sign=sign_with("Persona-Signature"),
             verify=verify_persona, event_ids=["evt_XGuYWp2TEWYBs8YJt3pBbyNo"], event_types=["inquiry.completed"],
             sig_headers=["Persona-Signature"], tolerance=300)
    for label, first, second in [("rotation header, old key first", "wbhsec_persona_old", "wbhsec_persona_0123"),
                                 ("rotation header, current key first", "wbhsec_persona_0123", "wbhsec_persona_old")]:
        h = WS.generate_signature_header(body, first, timestamp=NOW) + " " + WS.generate_signature_header(body, second, timestamp=NOW)
        req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"], ["Persona-Signature", h]], "body": body}
        lib_whole = raises_not(WS.verify_header, req["body"], h, "wbhsec_persona_0123", tolerance=None)
        emit("persona", label, psrc + f" (verify_header on the whole header answers {lib_whole})", ["wbhsec_persona_0123"], req,
             verify_persona(req, ["wbhsec_persona_0123"], NOW), "second_signature_wrong",
             ["evt_XGuYWp2TEWYBs8YJt3pBbyNo"], ["inquiry.completed"])

    # mux: verified by @mux/mux-node
    msrc = f"signed with {pyv('stripe')} WebhookSignature.generate_signature_header (identical); verified with {NODE.version('@mux/mux-node')} webhooks.verifySignature (5 min, past only)"

    def verify_mux(req, secrets, now):
        h = hget(req, "Mux-Signature")
        if not h:
            return False
        return any(NODE("mux.verify", body=req["body"], headers={"mux-signature": h}, secret=s, now=now) for s in secrets)
    body = cj({"type": "video.asset.ready", "object": {"type": "asset", "id": "0201p02fGKPE7MrbC269XRD7LpcHhrmbu0002"},
               "id": "3a56ac3d-33da-4366-855b-f592d898409d", "environment": {"name": "Production", "id": "j0863n"},
               "data": {"status": "ready", "id": "0201p02fGKPE7MrbC269XRD7LpcHhrmbu0002", "duration": 23.8, "aspect_ratio": "16:9",
                        "playback_ids": [{"policy": "public", "id": "uNbxnGLKJ00yfbijDO8COxTOyVKT01xpxW"}]},
               "created_at": "2025-11-29T23:59:59.000000Z", "attempts": [], "accessor_source": None, "accessor": None, "request_id": None})
    kind_set("mux", name="video.asset.ready", source=msrc, secrets=["mux-signing-secret-0123"], sign_key="mux-signing-secret-0123",
             wrong_key="mux-signing-secret-wrong", body=body, tamper=('"duration":23.8', '"duration":99.9'), sign=sign_with("Mux-Signature"),
             verify=verify_mux, event_ids=["3a56ac3d-33da-4366-855b-f592d898409d"], event_types=["video.asset.ready"],
             sig_headers=["Mux-Signature"], tolerance=300)
    good = WS.generate_signature_header(body, "mux-signing-secret-0123", timestamp=NOW)
    wrong = WS._compute_signature(f"{NOW}.{body}", "mux-signing-secret-old")
    h = good.replace(",v1=", f",v1={wrong},v1=")
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"], ["Mux-Signature", h]], "body": body}
    emit("mux", "two v1 signatures, the first wrong", msrc, ["mux-signing-secret-0123"], req,
         verify_mux(req, ["mux-signing-secret-0123"], NOW), "second_signature_wrong", ["3a56ac3d-33da-4366-855b-f592d898409d"], ["video.asset.ready"])


# ---------------------------------------------------------------- coinbase

def gen_coinbase():
    from coinbase_commerce.webhook import WebhookSignature
    src = f"{pyv('coinbase-commerce')} WebhookSignature._compute_signature (sign) / verify_sig_header"

    def sign(k, body, ts, u, q):
        return {"headers": [["X-CC-Webhook-Signature", WebhookSignature._compute_signature(body, k)]]}

    def verify(req, secrets, now):
        h = hget(req, "X-CC-Webhook-Signature")
        return h is not None and any(raises_not(WebhookSignature.verify_sig_header, req["body"], h, s) for s in secrets)

    body = cj({"id": 1, "scheduled_for": "2025-11-29T23:59:59Z", "attempt_number": 1, "event": {
        "id": "24934862-d980-46cb-9402-43c81b0cdba6", "resource": "event", "type": "charge:confirmed", "api_version": "2018-03-22",
        "created_at": "2025-11-29T23:59:58Z", "data": {"code": "66BEOV2A", "name": "The Sovereign Individual", "pricing_type": "fixed_price",
                                                        "pricing": {"local": {"amount": "100.00", "currency": "USD"}}}}})
    kind_set("coinbase", name="charge:confirmed", source=src, secrets=["cc-shared-secret-0123"], sign_key="cc-shared-secret-0123",
             wrong_key="cc-shared-secret-wrong", body=body, tamper=('"100.00"', '"1.00"'), sign=sign, verify=verify,
             event_ids=["24934862-d980-46cb-9402-43c81b0cdba6"], event_types=["charge:confirmed"], sig_headers=["X-CC-Webhook-Signature"])


# ---------------------------------------------------------------- pagerduty, docusign, recurly, trello, webflow, notion, workos

def gen_pagerduty():
    src = "hand signer (docs: PagerDuty 'Verifying signatures', V3 webhooks; no library)"

    def sign(k, body, ts, u, q):
        return {"headers": [["X-PagerDuty-Signature", "v1=" + hmac_hex(k, body)], ["X-Webhook-Id", "5ac64822-4adc-4fda-ade0-410becf0de4f"]]}

    def verify(req, secrets, now):
        h = hget(req, "X-PagerDuty-Signature")
        if not h:
            return False
        sigs = [p.strip()[3:] for p in h.split(",") if p.strip().startswith("v1=")]
        return any(hmac.compare_digest(x, hmac_hex(s, req["body"])) for x in sigs for s in secrets)

    body = cj({"event": {"id": "01DEN2WCXEJ7B7N3GQ8R8A5VDW", "event_type": "incident.triggered", "resource_type": "incident",
                         "occurred_at": "2025-11-29T23:59:59.000Z", "agent": {"html_url": "https://acme.pagerduty.com/users/PLH1HKV", "id": "PLH1HKV", "type": "user_reference"},
                         "data": {"id": "PGR0VU2", "type": "incident", "title": "A little bump in the road", "status": "triggered",
                                  "urgency": "high", "number": 2, "html_url": "https://acme.pagerduty.com/incidents/PGR0VU2"}}})
    secret = "pd-webhook-secret-0123"
    kind_set("pagerduty", name="incident.triggered", source=src, secrets=[secret], sign_key=secret, wrong_key=secret + "-wrong", body=body,
             tamper=('"high"', '"low"'), sign=sign, verify=verify, event_ids=["01DEN2WCXEJ7B7N3GQ8R8A5VDW"], event_types=["incident.triggered"],
             sig_headers=["X-PagerDuty-Signature"])
    h = "v1=" + hmac_hex("pd-webhook-secret-old", body) + ",v1=" + hmac_hex(secret, body)
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"], ["X-PagerDuty-Signature", h]], "body": body}
    emit("pagerduty", "two v1 signatures during a rotation, the first wrong", src, [secret], req, verify(req, [secret], NOW),
         "second_signature_wrong", ["01DEN2WCXEJ7B7N3GQ8R8A5VDW"], ["incident.triggered"])


def gen_docusign():
    src = "hand signer (docs: DocuSign Connect 'HMAC security'; no library)"
    k1, k2 = "ds-connect-hmac-key-1-0123456789abcdef=", "ds-connect-hmac-key-2-fedcba9876543210="

    def sign(keys, body, ts, u, q):
        return {"headers": [[f"X-DocuSign-Signature-{i + 1}", hmac_b64(k, body)] for i, k in enumerate(keys)]
                + [["X-Authorization-Digest", "HMACSHA256"]]}

    def verify(req, secrets, now):
        sigs = [v for k, v in req["headers"] if k.lower().startswith("x-docusign-signature-")]
        return any(hmac.compare_digest(x, hmac_b64(s, req["body"])) for x in sigs for s in secrets)

    body = cj({"event": "envelope-completed", "apiVersion": "v2.1", "uri": "/restapi/v2.1/accounts/9a5f.../envelopes/8c5f0a3e-1b2d-4e6f-9a7b-0c1d2e3f4a5b",
               "retryCount": 0, "configurationId": 10418370, "generatedDateTime": "2025-11-29T23:59:59.1234567Z",
               "data": {"accountId": "9a5f1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d", "userId": "1d2c3b4a-5f6e-4d7c-8b9a-0f1e2d3c4b5a",
                        "envelopeId": "8c5f0a3e-1b2d-4e6f-9a7b-0c1d2e3f4a5b"}})
    kind_set("docusign", name="envelope-completed, two keys", source=src, secrets=[k1, k2], sign_key=(k1, k2),
             wrong_key=("wrong-key-1", "wrong-key-2"), body=body, tamper=('"retryCount":0', '"retryCount":1'), sign=sign, verify=verify,
             event_ids=None, event_types=["envelope-completed"], sig_headers=["X-DocuSign-Signature-1", "X-DocuSign-Signature-2"])
    g = sign((k1, "ds-connect-hmac-key-not-configured"), body, NOW, None, "")
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"]] + g["headers"], "body": body}
    emit("docusign", "signature 2 from a key not configured", src, [k1], req, verify(req, [k1], NOW), "second_signature_wrong",
         None, ["envelope-completed"])


def gen_recurly():
    src = "hand signer (docs: Recurly 'Signature verification'; no library); ms timestamp, 5 min window"
    secret = "recurly-endpoint-key-0123"

    def sign(k, body, ts, u, q):
        ms = str(ts * 1000)
        return {"headers": [["recurly-signature", ms + "," + hmac_hex(k, ms + "." + body)]]}

    def verify(req, secrets, now):
        h = hget(req, "recurly-signature")
        if not h:
            return False
        parts = h.split(",")
        ms, sigs = parts[0], parts[1:]
        ok = any(hmac.compare_digest(x, hmac_hex(s, ms + "." + req["body"])) for x in sigs for s in secrets)
        return ok and abs(now * 1000 - int(ms)) <= 300_000

    body = cj({"id": "rh7qpoqsn8mn", "object_type": "charge_invoice", "site_id": "s0ghw2ujufuv", "event_type": "paid",
               "event_time": "2025-11-29T23:59:59Z", "account_code": "1", "uuid": "5d2e9b1f3a7c4e6d8b0a2c4e6f8a0b2c"})
    kind_set("recurly", name="charge_invoice.paid", source=src, secrets=[secret], sign_key=secret, wrong_key=secret + "-wrong", body=body,
             tamper=('"paid"', '"failed"'), sign=sign, verify=verify, event_ids=["rh7qpoqsn8mn"], event_types=["charge_invoice.paid"],
             sig_headers=["recurly-signature"], tolerance=300, future=True)
    ms = str(NOW * 1000)
    h = ms + "," + hmac_hex("recurly-endpoint-key-old", ms + "." + body) + "," + hmac_hex(secret, ms + "." + body)
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"], ["recurly-signature", h]], "body": body}
    emit("recurly", "two signatures during a rotation, the first wrong", src, [secret], req, verify(req, [secret], NOW),
         "second_signature_wrong", ["rh7qpoqsn8mn"], ["charge_invoice.paid"])


def gen_trello():
    src = "hand signer (docs: Trello 'Webhooks'; no library): base64 HMAC-SHA1(secret, body + callbackURL)"
    url = "https://example.com/hooks/trello"

    def sign(k, body, ts, u, q):
        return {"headers": [["X-Trello-Webhook", hmac_b64(k, body + u, hashlib.sha1)]]}

    def verify(req, secrets, now):
        h = hget(req, "X-Trello-Webhook")
        return h is not None and any(hmac.compare_digest(h, hmac_b64(s, req["body"] + full_url(req), hashlib.sha1)) for s in secrets)

    body = cj({"model": {"id": "5a1b2c3d4e5f6a7b8c9d0e1f", "name": "Roadmap"},
               "action": {"id": "6560f0a1b2c3d4e5f6a7b8c9", "idMemberCreator": "5a1b2c3d4e5f6a7b8c9d0e20", "type": "updateCard",
                          "date": "2025-11-29T23:59:59.000Z", "data": {"card": {"id": "6560f0a1b2c3d4e5f6a7b8d0", "name": "Ship it", "idList": "l2"},
                                                                         "listBefore": {"id": "l1", "name": "Doing"}, "listAfter": {"id": "l2", "name": "Done"},
                                                                         "old": {"idList": "l1"}}}})
    kind_set("trello", name="updateCard", source=src, secrets=["trello-app-secret-0123"], sign_key="trello-app-secret-0123",
             wrong_key="trello-app-secret-wrong", body=body, tamper=('Ship it', 'Ship it not'), sign=sign, verify=verify,
             event_ids=["6560f0a1b2c3d4e5f6a7b8c9"], event_types=["updateCard"], sig_headers=["X-Trello-Webhook"], public_url=url)


def gen_webflow():
    src = f"signed by hand (hex HMAC-SHA256 of ms timestamp + ':' + body); verified with {NODE.version('webflow-api')} WebhooksClient.verifySignature (checks no window)"

    def sign(k, body, ts, u, q):
        ms = str(ts * 1000)
        return {"headers": [["x-webflow-timestamp", ms], ["x-webflow-signature", hmac_hex(k, ms + ":" + body)]]}

    def verify(req, secrets, now):
        ts = hget(req, "x-webflow-timestamp")
        if ts is None or hget(req, "x-webflow-signature") is None:
            return False
        lib = any(NODE("webflow.verify", body=req["body"], headers=hdict(req), secret=s) for s in secrets)
        if abs(now * 1000 - int(ts)) > 300_000:
            return False, f"library answered {lib} (it checks no window); valid from PROVIDERS.md 5 min"
        return lib

    body = cj({"triggerType": "form_submission", "payload": {"name": "Contact Us", "siteId": "65427cf400e02b306eaa049c",
                                                              "data": {"First Name": "Zaphod", "Email": "zaphod@example.com"},
                                                              "submittedAt": "2025-11-29T23:59:59.000Z", "id": "6321ca84df3949bfc6752327",
                                                              "formId": "65429eadebe8a9f3a30f62d0", "formElementId": "4e038d2c-6a1e-4953-7be9-a59a2b453177"}})
    kind_set("webflow", name="form_submission", source=src, secrets=["webflow-secret-0123"], sign_key="webflow-secret-0123",
             wrong_key="webflow-secret-wrong", body=body, tamper=('Zaphod', 'Arthur'), sign=sign, verify=verify, event_ids=None,
             event_types=["form_submission"], sig_headers=["x-webflow-signature"], tolerance=300)


def gen_notion():
    src = f"{NODE.version('@notionhq/client')} signWebhookPayload / verifyWebhookSignature"

    def sign(k, body, ts, u, q):
        return {"headers": [["X-Notion-Signature", NODE("notion.sign", token=k, body=body)]]}

    def verify(req, secrets, now):
        h = hget(req, "X-Notion-Signature")
        return h is not None and any(NODE("notion.verify", token=s, body=req["body"], signature=h) for s in secrets)

    body = cj({"id": "367cba44-b6f3-4c92-81e7-6a2e9659efd4", "timestamp": "2025-11-29T23:59:59.000Z",
               "workspace_id": "13950b26-c203-4f3b-b97d-93ec06319565", "workspace_name": "Acme",
               "subscription_id": "29d75c0d-5546-4414-8459-7b7a92f1fc4b", "integration_id": "0ef104cd-477e-4d16-9f8e-3d1f1ba0b6c3",
               "type": "page.created", "authors": [{"id": "c7c11cca-1d73-471d-9b6e-bdef51470190", "type": "person"}],
               "accessible_by": [{"id": "556a1abf-4f08-40c6-878a-75890d2a88ba", "type": "person"}], "attempt_number": 1,
               "entity": {"id": "153104cd-477e-809d-8dc4-ff2d96ae3090", "type": "page"},
               "data": {"parent": {"id": "13950b26-c203-4f3b-b97d-93ec06319565", "type": "space"}}})
    kind_set("notion", name="page.created", source=src, secrets=["secret_notion_verification_token_0123"],
             sign_key="secret_notion_verification_token_0123", wrong_key="secret_notion_verification_token_wrong", body=body,
             tamper=('"attempt_number":1', '"attempt_number":2'), sign=sign, verify=verify,
             event_ids=["367cba44-b6f3-4c92-81e7-6a2e9659efd4"], event_types=["page.created"], sig_headers=["X-Notion-Signature"])


def gen_workos():
    from workos.webhooks._verification import verify_header
    src = (f"signed by hand per the library's construction (t=<ms>, v1=<hex HMAC-SHA256(ms.body)>); verified with "
           f"{pyv('workos')} workos.webhooks verify_header (tolerance 180 s both ways)")

    def sign(k, body, ts, u, q):
        ms = str(ts * 1000)
        return {"headers": [["WorkOS-Signature", f"t={ms}, v1={hmac_hex(k, ms + '.' + body)}"]]}

    def verify(req, secrets, now):
        h = hget(req, "WorkOS-Signature")
        if not h:
            return False
        with frozen(now):
            return any(raises_not(verify_header, event_body=req["body"].encode(), event_signature=h, secret=s, tolerance=180) for s in secrets)

    body = cj({"id": "event_01JDY2K3M4N5P6Q7R8S9T0V1W2", "event": "dsync.user.created", "created_at": "2025-11-29T23:59:59.000Z",
               "data": {"id": "directory_user_01E1X1B89NH8Z3SDFJR4H7RGX7", "directory_id": "directory_01ECAZ4NV9QMV47GW873HDCX74",
                        "organization_id": "org_01EZTR6WYX1A0DSE2CYMGXQ24Y", "first_name": "Veda", "last_name": "Torp",
                        "email": "veda@foo-corp.com", "state": "active"}})
    kind_set("workos", name="dsync.user.created", source=src, secrets=["workos-webhook-secret-0123"], sign_key="workos-webhook-secret-0123",
             wrong_key="workos-webhook-secret-wrong", body=body, tamper=('"Veda"', '"Vera"'), sign=sign, verify=verify,
             event_ids=["event_01JDY2K3M4N5P6Q7R8S9T0V1W2"], event_types=["dsync.user.created"], sig_headers=["WorkOS-Signature"],
             tolerance=180, future=True)


# ---------------------------------------------------------------- standard webhooks: standard, svix, clerk, resend

def gen_svix():
    import resend
    from standardwebhooks.webhooks import Webhook as StdWh
    from svix.webhooks import Webhook
    secret = "whsec_" + base64.b64encode(hashlib.sha256(b"idemhook svix test secret").digest()).decode()
    wrong = "whsec_" + base64.b64encode(hashlib.sha256(b"idemhook svix other secret").digest()).decode()

    def sign_with(prefix, msg_id):
        def sign(k, body, ts, u, q):
            sig = Webhook(k).sign(msg_id, dt.datetime.fromtimestamp(ts, dt.timezone.utc), body)
            return {"headers": [[f"{prefix}-id", msg_id], [f"{prefix}-timestamp", str(ts)], [f"{prefix}-signature", sig]]}
        return sign

    def verify_svix(req, secrets, now):
        with frozen(now):
            return any(raises_not(Webhook(s).verify, req["body"], hdict(req)) for s in secrets)

    def verify_std(req, secrets, now):
        with frozen(now):
            return any(raises_not(StdWh(s).verify, req["body"], hdict(req)) for s in secrets)

    def verify_resend(req, secrets, now):
        h = hdict(req)
        with frozen(now):
            res = any(raises_not(resend.Webhooks.verify, {"payload": req["body"], "headers": {"id": h.get("svix-id"), "timestamp": h.get("svix-timestamp"),
                                                                                           "signature": h.get("svix-signature")}, "webhook_secret": s})
                      for s in secrets)
        sv = verify_svix(req, secrets, now)
        if res != sv:
            return res, f"svix answered {sv}"
        return res

    svsrc = f"{pyv('svix')} Webhook.sign / verify"
    cases = [
        ("standard", "webhook", f"signed with {svsrc}; verified with {pyv('standardwebhooks')} Webhook.verify (svix's dependency)", verify_std,
         "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", cj({"type": "invoice.paid", "timestamp": "2025-11-29T23:59:59.000Z",
                                               "data": {"id": "inv_0123456789", "amount": 4200, "currency": "usd"}}), "invoice.paid",
         ('"amount":4200', '"amount":42')),
        ("svix", "svix", svsrc, verify_svix, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4X",
         cj({"type": "user.signup", "data": {"id": "user_0123", "email": "alice@example.com"}}), "user.signup",
         ('alice@', 'mallory@')),
        ("clerk", "svix", svsrc + " (Clerk's docs point to svix)", verify_svix, "msg_2pJ9ZrWmTqF6fGzUyN3kLd8xHsA",
         cj({"data": {"id": "user_29w83sxmDNGwOuEthce5gg56FcC", "object": "user", "first_name": "Example",
                      "email_addresses": [{"email_address": "example@example.org", "id": "idn_29w83yL7CwVlJXylYLxcslromF1"}],
                      "created_at": (NOW - 1) * 1000}, "event_attributes": {"http_request": {"client_ip": "0.0.0.0", "user_agent": "Mozilla/5.0"}},
             "instance_id": "ins_123", "object": "event", "timestamp": (NOW - 1) * 1000, "type": "user.created"}), "user.created",
         ('"Example"', '"Exampl3"')),
        ("resend", "svix", f"signed with {svsrc}; verified with {pyv('resend')} Webhooks.verify (its own HMAC code) and svix",
         verify_resend, "msg_2q8Wz4Jm0VnFhXb3pLkC7dRtYsE",
         cj({"type": "email.delivered", "created_at": "2025-11-29T23:59:59.000Z",
             "data": {"email_id": "56761188-7520-42d8-8898-ff6fc54ce618", "from": "Acme <onboarding@resend.dev>", "to": ["delivered@resend.dev"],
                      "subject": "Sending this example", "created_at": "2025-11-29T23:59:58.000Z"}}), "email.delivered",
         ('Sending this example', 'Sending that example')),
    ]
    for kind, prefix, src, verify, msg_id, body, etype, tamper in cases:
        g = kind_set(kind, name=etype, source=src, secrets=[secret], sign_key=secret, wrong_key=wrong, body=body, tamper=tamper,
                     sign=sign_with(prefix, msg_id), verify=verify, event_ids=[msg_id], event_types=[etype],
                     sig_headers=[f"{prefix}-signature"], tolerance=300, future=True)
        # two signatures, the first from a rotated-away secret
        old = Webhook(wrong).sign(msg_id, dt.datetime.fromtimestamp(NOW, dt.timezone.utc), body)
        req = copy.deepcopy(g)
        for h in req["headers"]:
            if h[0] == f"{prefix}-signature":
                h[1] = old + " " + h[1]
        emit(kind, f"{etype}: two signatures, the first wrong", src, [secret], req, verify(req, [secret], NOW),
             "second_signature_wrong", [msg_id], [etype])


# ---------------------------------------------------------------- main


# ---------------------------------------------------------------- generic kinds (hmac, basic, token), configured by hand

def generic_set(config, wrong_secrets=None, **kw):
    """kind_set for a generic kind: the vectors carry the source's TOML lines
    (`config`, after kind and secrets) and, for public keys, another key
    of the same shape (`wrong_secrets`) for the hand-made negatives."""
    first = len(VECTORS)
    g = kind_set(**kw)
    for v in VECTORS[first:]:
        v["config"] = config
        if wrong_secrets is not None:
            v["wrong_secrets"] = wrong_secrets
    return g


def tag_config(first, config, wrong_secrets=None):
    for v in VECTORS[first:]:
        v["config"] = config
        if wrong_secrets is not None:
            v["wrong_secrets"] = wrong_secrets


def gen_generic():
    import unicodedata

    import nacl.signing
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.exceptions import InvalidSignature
    from easypost.util import validate_webhook
    import telnyx.lib.webhook_verification as telnyx_wv

    def lines(**kv):
        return "".join(f"{k} = {json.dumps(v, ensure_ascii=False)}\n" for k, v in kv.items())

    # Paystack: hex HMAC-SHA512 of the body with the secret key.
    psrc = "signed and verified by hand with Python hmac: Paystack's documented construction (hex HMAC-SHA512 of the body, x-paystack-signature)"

    def p_sign(k, body, ts, u, q):
        return {"headers": [["x-paystack-signature", hmac_hex(k, body, hashlib.sha512)]]}

    def p_verify(req, secrets, now):
        sig = hget(req, "x-paystack-signature")
        return sig is not None and any(hmac.compare_digest(hmac_hex(s, req["body"], hashlib.sha512), sig) for s in secrets)

    body = cj({"event": "charge.success", "data": {"id": 302961, "domain": "test", "status": "success",
                                                   "reference": "qTPrJoy9Bx", "amount": 10000, "currency": "NGN"}})
    generic_set(lines(header="x-paystack-signature", algorithm="sha512", key=["json:/event", "json:/data/id"], type="json:/event"),
                kind="hmac", name="paystack charge.success (sha512 hex)", source=psrc, secrets=["sk_test_paystack_0123"],
                sign_key="sk_test_paystack_0123", wrong_key="sk_test_paystack_wrong", body=body, tamper=("10000", "90000"),
                sign=p_sign, verify=p_verify, event_ids=None, event_types=["charge.success"], sig_headers=["x-paystack-signature"])

    # EasyPost: hmac-sha256-hex= + hex HMAC-SHA256, keyed with the NFKD-normalised secret.
    esrc = f"signed by hand (hex HMAC-SHA256, the secret NFKD-normalised); verified with {pyv('easypost')} easypost.util.validate_webhook"
    secret = "\ufb01ne-easypost-secret-\u00c5"

    def e_sign_with(normalise):
        def sign(k, body, ts, u, q):
            key = unicodedata.normalize("NFKD", k) if normalise else k
            mac = hmac.new(key.encode("utf-8"), body.encode(), hashlib.sha256).hexdigest()
            return {"headers": [["X-Hmac-Signature", "hmac-sha256-hex=" + mac]]}
        return sign

    def e_verify(req, secrets, now):
        return any(raises_not(validate_webhook, req["body"].encode(), dict(req["headers"]), s) for s in secrets)

    body = cj({"id": "evt_3c8a7e1b2d4f", "object": "Event", "mode": "test", "description": "tracker.updated",
               "result": {"id": "trk_0123", "object": "Tracker", "status": "in_transit"}})
    econfig = lines(header="X-Hmac-Signature", prefix="hmac-sha256-hex=", secret_normalize="nfkd", key=["json:/id"], type="json:/description")
    g = generic_set(econfig, kind="hmac", name="easypost tracker.updated (secret NFKD-normalised)", source=esrc, secrets=[secret],
                    sign_key=secret, wrong_key=secret + "-wrong", body=body, tamper=("in_transit", "delivered"),
                    sign=e_sign_with(True), verify=e_verify, event_ids=["evt_3c8a7e1b2d4f"], event_types=["tracker.updated"],
                    sig_headers=["X-Hmac-Signature"])
    first = len(VECTORS)
    r = copy.deepcopy(g)
    r["headers"] = [["Content-Type", "application/json"]] + e_sign_with(False)(secret, body, NOW, None, "")["headers"]
    res = e_verify(r, [secret], NOW)
    assert not res
    emit("hmac", "easypost: signed with the secret not normalised", esrc, [secret], r, res, "unnormalised_secret")
    tag_config(first, econfig)

    # Telnyx: Ed25519 over "{timestamp}|{body}", base64, with a 5-minute window.
    tsrc = (f"signed with {pyv('pynacl')} SigningKey.sign over timestamp|body; verified with "
            f"{pyv('telnyx')} telnyx.lib.webhook_verification.verify_webhook_signature (its clock frozen at now)")
    seed = hashlib.sha256(b"idemhook telnyx test key 1").digest()
    sk, other = nacl.signing.SigningKey(seed), nacl.signing.SigningKey(hashlib.sha256(b"idemhook telnyx test key 2").digest())
    pub = base64.b64encode(sk.verify_key.encode()).decode()
    other_pub = base64.b64encode(other.verify_key.encode()).decode()
    pem = Ed25519PrivateKey.from_private_bytes(seed).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()

    def t_sign(k, body, ts, u, q):
        sig = base64.b64encode(k.sign(f"{ts}|{body}".encode()).signature).decode()
        return {"headers": [["telnyx-signature-ed25519", sig], ["telnyx-timestamp", str(ts)]]}

    def t_verify(req, secrets, now):
        old = telnyx_wv.time.time
        telnyx_wv.time.time = lambda: float(now)
        try:
            return any(raises_not(telnyx_wv.verify_webhook_signature, req["body"], dict(req["headers"]), s) for s in secrets)
        finally:
            telnyx_wv.time.time = old

    body = cj({"data": {"event_type": "call.initiated", "id": "0ccc7b54-4df3-4bca-a65a-3da1ecc777f0",
                        "occurred_at": "2025-11-29T23:59:50.000000Z", "payload": {"call_control_id": "v3:abc", "direction": "incoming"},
                        "record_type": "event"}, "meta": {"attempt": 1, "delivered_to": "https://example.com/hooks/telnyx"}})
    generic_set(lines(algorithm="ed25519", encoding="base64", header="telnyx-signature-ed25519", template="{timestamp}|{body}",
                      timestamp_header="telnyx-timestamp", key=["json:/data/id"], type="json:/data/event_type"),
                wrong_secrets=[other_pub], kind="hmac", name="telnyx call.initiated (ed25519, timestamp|body)", source=tsrc,
                secrets=[pub], sign_key=sk, wrong_key=other, body=body, tamper=("incoming", "outgoing"), sign=t_sign,
                verify=t_verify, event_ids=["0ccc7b54-4df3-4bca-a65a-3da1ecc777f0"], event_types=["call.initiated"],
                sig_headers=["telnyx-signature-ed25519"], tolerance=300, future=True, pk=pem)

    # Ed25519, public key as PEM, signature base64url, no timestamp.
    csrc = f"signed and verified with {pyv('cryptography')} Ed25519PrivateKey.sign / Ed25519PublicKey.verify"
    ek = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"idemhook generic ed25519 key 1").digest())
    ek2 = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"idemhook generic ed25519 key 2").digest())

    def spki_pem(k):
        return k.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def pkcs8(k):
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()

    def b64url(b):
        return base64.urlsafe_b64encode(b).decode().rstrip("=")

    def unb64url(s):
        return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))

    def ed_sign(k, body, ts, u, q):
        return {"headers": [["X-Signature", b64url(k.sign(body.encode()))]]}

    def ed_verify(req, secrets, now):
        sig = hget(req, "X-Signature")
        if sig is None:
            return False
        ok = False
        for s in secrets:
            try:
                serialization.load_pem_public_key(s.encode()).verify(unb64url(sig), req["body"].encode())
                ok = True
            except (InvalidSignature, ValueError):
                pass
        return ok

    body = cj({"id": "ev_ed_0001", "type": "order.paid", "data": {"order": "ord_1", "total": "12.50"}})
    generic_set(lines(algorithm="ed25519", encoding="base64url", header="X-Signature", key=["json:/id"], type="json:/type"),
                wrong_secrets=[spki_pem(ek2)], kind="hmac", name="ed25519, PEM public key, base64url signature", source=csrc,
                secrets=[spki_pem(ek)], sign_key=ek, wrong_key=ek2, body=body, tamper=("12.50", "99.50"), sign=ed_sign,
                verify=ed_verify, event_ids=["ev_ed_0001"], event_types=["order.paid"], sig_headers=["X-Signature"], pk=pkcs8(ek))

    # ECDSA P-256 over timestamp.body, DER base64, public key PEM.
    n = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551

    def ec_key(label):
        d = int.from_bytes(hashlib.sha256(label.encode()).digest(), "big") % (n - 1) + 1
        return ec.derive_private_key(d, ec.SECP256R1())

    pk1, pk2 = ec_key("idemhook generic p256 key 1"), ec_key("idemhook generic p256 key 2")
    psrc2 = (f"signed with {pyv('cryptography')} ECDSA P-256/SHA-256 (RFC 6979 deterministic, DER); verified with "
             f"{pyv('cryptography')} EllipticCurvePublicKey.verify")

    def ec_sign(k, body, ts, u, q):
        sig = k.sign(f"{ts}.{body}".encode(), ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
        return {"headers": [["X-Ecdsa-Signature", base64.b64encode(sig).decode()], ["X-Ecdsa-Timestamp", str(ts)]]}

    def ec_verify(req, secrets, now):
        sig, ts = hget(req, "X-Ecdsa-Signature"), hget(req, "X-Ecdsa-Timestamp")
        if sig is None or ts is None:
            return False
        ok = False
        for s in secrets:
            try:
                serialization.load_pem_public_key(s.encode()).verify(
                    base64.b64decode(sig), f"{ts}.{req['body']}".encode(), ec.ECDSA(hashes.SHA256()))
                ok = True
            except (InvalidSignature, ValueError):
                pass
        if ok and abs(now - int(ts)) > 300:
            return False, "the library checks no window; valid from the source's tolerance (5m)"
        return ok

    body = cj({"id": "ev_ec_0001", "type": "shipment.created", "data": {"shipment": "shp_1"}})
    generic_set(lines(algorithm="ecdsa-p256", encoding="base64", header="X-Ecdsa-Signature", template="{timestamp}.{body}",
                      timestamp_header="X-Ecdsa-Timestamp", key=["json:/id"], type="json:/type"),
                wrong_secrets=[spki_pem(pk2)], kind="hmac", name="ecdsa-p256 over timestamp.body, DER base64, PEM key",
                source=psrc2, secrets=[spki_pem(pk1)], sign_key=pk1, wrong_key=pk2, body=body, tamper=("shp_1", "shp_2"),
                sign=ec_sign, verify=ec_verify, event_ids=["ev_ec_0001"], event_types=["shipment.created"],
                sig_headers=["X-Ecdsa-Signature"], tolerance=300, future=True, pk=pkcs8(pk1))

    # HMAC-SHA256, base64url, the secret base64 (and, next, hex) decoded into key bytes.
    raw = hashlib.sha256(b"idemhook generic binary key").digest()
    hsrc = "signed and verified by hand with Python hmac (the key: the bytes the secret encodes)"
    for enc, text in [("base64", base64.b64encode(raw).decode()), ("hex", raw.hex())]:
        def k_sign(k, body, ts, u, q):
            return {"headers": [["X-Sig", b64url(hmac.new(k, body.encode(), hashlib.sha256).digest())]]}

        def k_verify(req, secrets, now, enc=enc):
            sig = hget(req, "X-Sig")
            keys = [base64.b64decode(s) if enc == "base64" else bytes.fromhex(s) for s in secrets]
            return sig is not None and any(
                hmac.compare_digest(b64url(hmac.new(k, req["body"].encode(), hashlib.sha256).digest()), sig) for k in keys)

        body = cj({"id": f"ev_{enc}_0001", "type": "thing.happened"})
        wrong = hashlib.sha256(b"another key").digest()
        wtext = base64.b64encode(wrong).decode() if enc == "base64" else wrong.hex()
        generic_set(lines(encoding="base64url", secret_encoding=enc, header="X-Sig", key=["json:/id"], type="json:/type"),
                    wrong_secrets=[wtext], kind="hmac", name=f"sha256 base64url, secret_encoding {enc}", source=hsrc,
                    secrets=[text], sign_key=raw, wrong_key=wrong, body=body, tamper=("thing", "other"), sign=k_sign,
                    verify=k_verify, event_ids=[f"ev_{enc}_0001"], event_types=["thing.happened"], sig_headers=["X-Sig"])

    # Basic (Chargebee): Authorization: Basic base64(user:password), RFC 7617.
    bsrc = "written by hand per RFC 7617 (Python base64); verified by comparing the decoded user:password"

    def b_sign(k, body, ts, u, q):
        return {"headers": [["Authorization", "Basic " + base64.b64encode(k.encode()).decode()]]}

    def b_verify(req, secrets, now):
        a = hget(req, "Authorization")
        if a is None or not a.startswith("Basic "):
            return False
        try:
            sent = base64.b64decode(a[6:], validate=True).decode()
        except Exception:
            return False
        return any(hmac.compare_digest(sent, s) for s in secrets)

    body = cj({"id": "ev_16BHbhF4s42tO2lK", "occurred_at": NOW - 5, "event_type": "subscription_created",
               "content": {"subscription": {"id": "sub_1", "status": "active"}}})
    first = len(VECTORS)
    g = b_sign("cb_user:cb-pass-0123", body, NOW, None, "")
    req = {"public_url": None, "method": "POST", "query": "", "headers": [["Content-Type", "application/json"]] + g["headers"], "body": body}
    bconfig = lines(key=["json:/id"], type="json:/event_type")
    emit("basic", "chargebee subscription_created (two secrets, the second matches)", bsrc, ["cb_user:new", "cb_user:cb-pass-0123"],
         req, b_verify(req, ["cb_user:new", "cb_user:cb-pass-0123"], NOW), None, ["ev_16BHbhF4s42tO2lK"], ["subscription_created"])
    w = copy.deepcopy(req)
    w["headers"] = [["Content-Type", "application/json"]] + b_sign("cb_user:cb-pass-012", body, NOW, None, "")["headers"]
    emit("basic", "chargebee: a password one character short", bsrc, ["cb_user:cb-pass-0123"], w,
         b_verify(w, ["cb_user:cb-pass-0123"], NOW), "wrong_secret")
    m = copy.deepcopy(req)
    m["headers"] = [["Content-Type", "application/json"]]
    emit("basic", "chargebee: no Authorization", bsrc, ["cb_user:cb-pass-0123"], m, False, "missing_header")
    tag_config(first, bconfig)

    # Token (Flutterwave's verif-hash): the header is the secret itself.
    fsrc = "written by hand (Flutterwave's documented verif-hash: the secret hash itself); verified by comparing it"
    body = cj({"event": "charge.completed", "data": {"id": 285959875, "tx_ref": "Links-616626414629", "status": "successful"}})
    first = len(VECTORS)
    for label, sent, mutation in [("flutterwave charge.completed", "flw-secret-hash-0123", None),
                                  ("flutterwave: a prefix of the secret", "flw-secret-hash-012", "wrong_secret"),
                                  ("flutterwave: the secret and more", "flw-secret-hash-01234", "wrong_secret")]:
        req = {"public_url": None, "method": "POST", "query": "",
               "headers": [["Content-Type", "application/json"], ["verif-hash", sent]], "body": body}
        emit("token", label, fsrc, ["flw-secret-hash-0123"], req, hmac.compare_digest(sent, "flw-secret-hash-0123"), mutation,
             ["285959875"] if mutation is None else None, ["charge.completed"] if mutation is None else None)
    tag_config(first, lines(header="verif-hash", key=["json:/data/id"], type="json:/event"))

    # Xero: base64 HMAC-SHA256 of the body; events in a batch; the empty "intent to receive".
    xsrc = "signed and verified by hand with Python hmac: Xero's documented construction (base64 HMAC-SHA256 of the body, x-xero-signature)"

    def x_sign(k, body, ts, u, q):
        return {"headers": [["x-xero-signature", hmac_b64(k, body)]]}

    def x_verify(req, secrets, now):
        sig = hget(req, "x-xero-signature")
        return sig is not None and any(hmac.compare_digest(hmac_b64(s, req["body"]), sig) for s in secrets)

    ev = [{"resourceUrl": "https://api.xero.com/api.xro/2.0/Invoices/i-1", "resourceId": "i-1",
           "eventDateUtc": "2025-11-29T23:59:00.000", "eventType": "UPDATE", "eventCategory": "INVOICE",
           "tenantId": "c2cc9b6e-9458-4c7d-93cc-f02b81b0594f", "tenantType": "ORGANISATION"},
          {"resourceUrl": "https://api.xero.com/api.xro/2.0/Contacts/c-1", "resourceId": "c-1",
           "eventDateUtc": "2025-11-29T23:59:01.000", "eventType": "CREATE", "eventCategory": "CONTACT",
           "tenantId": "c2cc9b6e-9458-4c7d-93cc-f02b81b0594f", "tenantType": "ORGANISATION"}]
    xconfig = lines(header="x-xero-signature", encoding="base64", batch="json:/events",
                    item_key=["json:/resourceId", "json:/eventCategory", "json:/eventType", "json:/eventDateUtc"],
                    item_type="json:/eventType", answer="empty")
    body = cj({"events": ev, "firstEventSequence": 1, "lastEventSequence": 2, "entropy": "S0M3"})
    generic_set(xconfig, kind="hmac", name="xero batch of two events", source=xsrc, secrets=["xero-webhook-key-0123"],
                sign_key="xero-webhook-key-0123", wrong_key="xero-webhook-key-wrong", body=body, tamper=("UPDATE", "DELETE"),
                sign=x_sign, verify=x_verify, event_ids=None, event_types=["UPDATE", "CREATE"], sig_headers=["x-xero-signature"])
    first = len(VECTORS)
    body = cj({"events": [], "firstEventSequence": 0, "lastEventSequence": 0, "entropy": "TEST"})
    for label, key, mutation in [("xero intent to receive (empty batch), signed", "xero-webhook-key-0123", None),
                                 ("xero intent to receive, badly signed", "xero-webhook-key-wrong", "wrong_secret")]:
        req = {"public_url": None, "method": "POST", "query": "",
               "headers": [["Content-Type", "application/json"]] + x_sign(key, body, NOW, None, "")["headers"], "body": body}
        emit("hmac", label, xsrc, ["xero-webhook-key-0123"], req, x_verify(req, ["xero-webhook-key-0123"], NOW), mutation,
             [] if mutation is None else None, [] if mutation is None else None)
    tag_config(first, xconfig)


# ---------------------------------------------------------------- the original kinds

@contextlib.contextmanager
def clock(now):
    """time.time reads `now` (Stripe's verify_header reads only it)."""
    old = time.time
    time.time = lambda: float(now)
    try:
        yield
    finally:
        time.time = old


def gen_original():
    """stripe, github, shopify, slack, paddle and linear (standard's are gen_svix's)."""
    import stripe
    WS = stripe.WebhookSignature

    # stripe: verified by the library (tolerance 300 s, past only)
    body = cj({"id": "evt_1QbX2cLkdIwHu7ix0a1b2c3d", "object": "event", "api_version": "2024-06-20", "created": NOW - 1,
               "data": {"object": {"id": "ch_3QbX2cLkdIwHu7ix1e2f3g4h", "object": "charge", "amount": 2000, "currency": "usd",
                                   "customer": "cus_Qx1y2z3a4b5c6d", "paid": True, "status": "succeeded"}},
               "livemode": False, "pending_webhooks": 1, "request": {"id": None, "idempotency_key": None},
               "type": "charge.succeeded"})

    def stripe_sign(k, b, ts, u, q):
        # (generate_signature_header is stripe >= 12's; the same header by hand before)
        make = getattr(WS, "generate_signature_header", None)
        h = make(b, k, timestamp=ts) if make else f"t={ts},v1={WS._compute_signature(f'{ts}.{b}', k)}"
        return {"headers": [["Stripe-Signature", h]]}

    def stripe_verify(req, secrets, now):
        h = hget(req, "Stripe-Signature")
        if not h:
            return False
        with clock(now):
            return any(raises_not(WS.verify_header, req["body"], h, s, tolerance=300) for s in secrets)
    kind_set("stripe", name="charge.succeeded", source=f"{pyv('stripe')} WebhookSignature.generate_signature_header / verify_header",
             secrets=["whsec_stripe_test_0123"], sign_key="whsec_stripe_test_0123", wrong_key="whsec_stripe_test_wrong", body=body,
             tamper=('"amount":2000', '"amount":1'), sign=stripe_sign, verify=stripe_verify,
             event_ids=["evt_1QbX2cLkdIwHu7ix0a1b2c3d"], event_types=["charge.succeeded"], sig_headers=["Stripe-Signature"],
             tolerance=300)

    # github
    body = cj({"ref": "refs/heads/main", "before": "6113728f27ae82c7b1a177c8d03f9e96e0adf246",
               "after": "59b20b8d5c6ff8d09518454d4dd8b7b30f095ab5", "repository": {"id": 1296269, "full_name": "octocat/Hello-World"},
               "pusher": {"name": "octocat"}, "sender": {"login": "octocat", "id": 1}})
    simple("github", doc="GitHub 'Validating webhook deliveries'", header="X-Hub-Signature-256", fmt=("sha256=", "hex"), body=body,
           secret="github-webhook-secret-0123", tamper=("refs/heads/main", "refs/heads/evil"),
           ids=["72d3162e-cc78-11e3-81ab-4c9367dc0958"], types=["push"],
           extra=[["X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"], ["X-GitHub-Event", "push"],
                  ["X-GitHub-Hook-ID", "292430182"]], name="push")

    # shopify
    body = cj({"id": 820982911946154508, "email": "jon@example.com", "total_price": "199.00", "currency": "USD",
               "financial_status": "paid", "line_items": [{"id": 866550311766439020, "quantity": 1, "price": "199.00"}]})
    simple("shopify", doc="Shopify 'Verify webhooks'", header="X-Shopify-Hmac-Sha256", fmt="b64", body=body,
           secret="shpss_shopify_test_0123", tamper=('"199.00"', '"1.00"'), ids=["b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"],
           types=["orders/create"],
           extra=[["X-Shopify-Topic", "orders/create"], ["X-Shopify-Shop-Domain", "example.myshopify.com"],
                  ["X-Shopify-Event-Id", "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"],
                  ["X-Shopify-Webhook-Id", "a8f1e2d3-c4b5-4a69-8778-695a4b3c2d1e"]], name="orders/create")

    # slack: v0=HMAC of v0:ts:body, the timestamp within 5 minutes either way (as slack_sdk's SignatureVerifier)
    body = cj({"token": "XXYYZZ", "team_id": "T0DEMO", "api_app_id": "A0DEMO", "type": "event_callback",
               "event": {"type": "message", "channel": "C0DEMO", "user": "U0DEMO", "text": "hello", "ts": "1764460799.000100"},
               "event_id": "Ev0A1B2C3D4E", "event_time": NOW - 1})

    def slack_sign(k, b, ts, u, q):
        return {"headers": [["X-Slack-Request-Timestamp", str(ts)], ["X-Slack-Signature", "v0=" + hmac_hex(k, f"v0:{ts}:{b}")]]}

    def slack_verify(req, secrets, now):
        ts, sig = hget(req, "X-Slack-Request-Timestamp"), hget(req, "X-Slack-Signature")
        if not ts or not sig or abs(now - int(ts)) > 300:
            return False
        return any(hmac.compare_digest(sig, "v0=" + hmac_hex(s, f"v0:{ts}:{req['body']}")) for s in secrets)
    kind_set("slack", name="event_callback message", source="hand signer (docs: Slack 'Verifying requests from Slack'; 5 minutes either way, as slack_sdk)",
             secrets=["8f742231b10e8888abcd99yyyzzz85a5"], sign_key="8f742231b10e8888abcd99yyyzzz85a5",
             wrong_key="8f742231b10e8888abcd99yyyzzz85a6", body=body, tamper=('"hello"', '"hullo"'), sign=slack_sign,
             verify=slack_verify, event_ids=["Ev0A1B2C3D4E"], event_types=["message"],
             sig_headers=["X-Slack-Signature", "X-Slack-Request-Timestamp"], tolerance=300, future=True)

    # paddle: ts=..;h1=HMAC of ts:body
    body = cj({"event_id": "evt_01jdy2k3m4n5p6q7r8s9t0v1w2", "event_type": "transaction.completed",
               "occurred_at": "2025-11-29T23:59:59.000000Z", "notification_id": "ntf_01jdy2k3m4n5p6q7r8s9t0v1w3",
               "data": {"id": "txn_01jdy2k3m4n5p6q7r8s9t0v1w4", "status": "completed", "currency_code": "USD",
                        "details": {"totals": {"total": "2000"}}}})

    def paddle_sign(k, b, ts, u, q):
        return {"headers": [["Paddle-Signature", f"ts={ts};h1=" + hmac_hex(k, f"{ts}:{b}")]]}

    def paddle_verify(req, secrets, now):
        h = hget(req, "Paddle-Signature")
        if not h:
            return False
        parts = dict(p.split("=", 1) for p in h.split(";"))
        ts = parts.get("ts")
        if not ts or abs(now - int(ts)) > 300:
            return False
        return any(hmac.compare_digest(parts.get("h1", ""), hmac_hex(s, f"{ts}:{req['body']}")) for s in secrets)
    kind_set("paddle", name="transaction.completed", source="hand signer (docs: Paddle 'Verify webhook signatures'; tolerance 300 s)",
             secrets=["pdl_ntfset_01jdy2k3_test0123"], sign_key="pdl_ntfset_01jdy2k3_test0123",
             wrong_key="pdl_ntfset_01jdy2k3_wrong0123", body=body, tamper=('"2000"', '"1"'), sign=paddle_sign,
             verify=paddle_verify, event_ids=["evt_01jdy2k3m4n5p6q7r8s9t0v1w2"], event_types=["transaction.completed"],
             sig_headers=["Paddle-Signature"], tolerance=300)

    # linear: HMAC of the body; webhookTimestamp (ms) in the signed body within a minute (Linear's docs), 300 s here
    def linear_body(ts):
        return cj({"action": "create", "type": "Issue", "createdAt": "2025-11-29T23:59:59.000Z",
                   "data": {"id": "2174add1-f7c8-44e3-bbf3-2d60b5ea8bc9", "title": "Fix the login page", "priority": 2},
                   "url": "https://linear.app/acme/issue/ENG-1", "organizationId": "b5a1c2d3-e4f5-4a6b-8c7d-9e0f1a2b3c4d",
                   "webhookTimestamp": ts * 1000, "webhookId": "000042e3-d123-4980-b49f-8e140eef9329"})

    def linear_sign(k, b, ts, u, q):
        b = linear_body(ts)
        return {"headers": [["Linear-Delivery", "234d1a4e-b617-4388-90fe-adc3633d6b72"], ["Linear-Event", "Issue"],
                            ["Linear-Signature", hmac_hex(k, b)]], "body": b}

    def linear_verify(req, secrets, now):
        sig = hget(req, "Linear-Signature")
        if not sig or not any(hmac.compare_digest(sig, hmac_hex(s, req["body"])) for s in secrets):
            return False
        return abs(now - json.loads(req["body"])["webhookTimestamp"] // 1000) <= 300
    kind_set("linear", name="Issue create", source="hand signer (docs: Linear 'Webhooks: securing webhooks'; webhookTimestamp within 300 s)",
             secrets=["lin_wh_test_0123"], sign_key="lin_wh_test_0123", wrong_key="lin_wh_test_wrong", body=linear_body(NOW),
             tamper=("Fix the login page", "Break the login page"), sign=linear_sign, verify=linear_verify,
             event_ids=["234d1a4e-b617-4388-90fe-adc3633d6b72"], event_types=["Issue"], sig_headers=["Linear-Signature"],
             tolerance=300)


def main():
    global NODE
    ap = argparse.ArgumentParser()
    ap.add_argument("--node-dir", default=os.environ.get("VEC_NODE_DIR", "/tmp/vecnpm"),
                    help="folder with package.json's packages installed (node_modules)")
    args = ap.parse_args()
    NODE = Node(args.node_dir)
    try:
        for g in [gen_twilio, gen_sendgrid, gen_discord, gen_square, gen_hubspot, gen_razorpay, gen_adyen, gen_gocardless,
                  gen_box, gen_mailgun, gen_gitlab, gen_bitbucket_meta, gen_zoom, gen_simple, gen_twitch, gen_stripe_style,
                  gen_coinbase, gen_pagerduty, gen_msgraph, gen_okta, gen_docusign, gen_workos, gen_trello, gen_notion,
                  gen_webflow, gen_postmark, gen_recurly, gen_svix, gen_generic, gen_original]:
            g()
    finally:
        NODE.close()
    out = {"note": "written by tests/vectors/gen/gen.py; do not edit by hand", "vectors": VECTORS}
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("{\"note\": " + json.dumps(out["note"]) + ",\n \"vectors\": [\n")
        f.write(",\n".join("  " + json.dumps(v, ensure_ascii=False) for v in VECTORS))
        f.write("\n ]}\n")
    kinds = sorted({v["kind"] for v in VECTORS})
    print(f"{len(VECTORS)} vectors, {len(kinds)} kinds: {' '.join(kinds)}")


if __name__ == "__main__":
    main()
