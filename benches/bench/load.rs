//! The load generator: keep-alive connections, raw HTTP/1.1, every
//! request once, latencies and fates recorded.

use super::*;

#[derive(Debug)]
pub(crate) enum Fail {
    Timeout,
    Closed,
    Io(String),
    Protocol(String),
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fail::Timeout => write!(f, "no answer"),
            Fail::Closed => write!(f, "connection closed"),
            Fail::Io(e) => write!(f, "i/o error: {e}"),
            Fail::Protocol(e) => write!(f, "bad response: {e}"),
        }
    }
}

pub(crate) struct Response {
    pub(crate) status: u16,
    /// The body, kept only when it is short (all our answers are).
    pub(crate) body: Vec<u8>,
    pub(crate) close: bool,
}

/// One keep-alive HTTP/1.1 connection with its own read buffer.
pub(crate) struct Conn {
    pub(crate) stream: TcpStream,
    pub(crate) buf: Vec<u8>,
    pub(crate) pos: usize,
    pub(crate) len: usize,
}

impl Conn {
    pub(crate) fn connect(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        // Reads wake up this often to check the request's deadline.
        stream.set_read_timeout(Some(Duration::from_millis(250)))?;
        stream.set_write_timeout(Some(ANSWER_TIMEOUT))?;
        Ok(Conn {
            stream,
            buf: vec![0; 16 * 1024],
            pos: 0,
            len: 0,
        })
    }

    pub(crate) fn fill(&mut self, deadline: Instant) -> Result<(), Fail> {
        if self.pos == self.len {
            self.pos = 0;
            self.len = 0;
        } else if self.len == self.buf.len() {
            self.buf.copy_within(self.pos..self.len, 0);
            self.len -= self.pos;
            self.pos = 0;
            if self.len == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
        }
        loop {
            match self.stream.read(&mut self.buf[self.len..]) {
                Ok(0) => return Err(Fail::Closed),
                Ok(n) => {
                    self.len += n;
                    return Ok(());
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if Instant::now() >= deadline {
                        return Err(Fail::Timeout);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Fail::Io(e.to_string())),
            }
        }
    }

    pub(crate) fn find(&self, pat: &[u8]) -> Option<usize> {
        self.buf[self.pos..self.len]
            .windows(pat.len())
            .position(|w| w == pat)
    }

    /// Ensures `n` unread bytes are buffered.
    pub(crate) fn need(&mut self, n: usize, deadline: Instant) -> Result<(), Fail> {
        while self.len - self.pos < n {
            if self.pos + n > self.buf.len() {
                self.buf.copy_within(self.pos..self.len, 0);
                self.len -= self.pos;
                self.pos = 0;
                if n > self.buf.len() {
                    self.buf.resize(n.next_power_of_two(), 0);
                }
            }
            self.fill(deadline)?;
        }
        Ok(())
    }

    pub(crate) fn line(&mut self, deadline: Instant) -> Result<String, Fail> {
        loop {
            if let Some(i) = self.find(b"\r\n") {
                let s = String::from_utf8_lossy(&self.buf[self.pos..self.pos + i]).into_owned();
                self.pos += i + 2;
                return Ok(s);
            }
            if self.len - self.pos > 64 * 1024 {
                return Err(Fail::Protocol("line longer than 64 KiB".into()));
            }
            self.fill(deadline)?;
        }
    }

    pub(crate) fn take_body(
        &mut self,
        n: usize,
        out: &mut Vec<u8>,
        deadline: Instant,
    ) -> Result<(), Fail> {
        self.need(n, deadline)?;
        if out.len() < 4096 {
            out.extend_from_slice(&self.buf[self.pos..self.pos + n.min(4096)]);
        }
        self.pos += n;
        Ok(())
    }

    /// Writes one request and reads its whole response.
    pub(crate) fn exchange(&mut self, request: &[u8], deadline: Instant) -> Result<Response, Fail> {
        self.stream.write_all(request).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Fail::Timeout,
            _ => Fail::Io(e.to_string()),
        })?;
        self.read_response(deadline)
    }

    pub(crate) fn read_response(&mut self, deadline: Instant) -> Result<Response, Fail> {
        let status_line = self.line(deadline)?;
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or("");
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Fail::Protocol(format!("bad status line {status_line:?}")))?;
        let mut content_length = None;
        let mut chunked = false;
        let mut close = version == "HTTP/1.0";
        loop {
            let line = self.line(deadline)?;
            if line.is_empty() {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                return Err(Fail::Protocol(format!("bad header {line:?}")));
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.parse::<usize>().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.to_ascii_lowercase().contains("chunked");
            } else if name.eq_ignore_ascii_case("connection") {
                close = value.eq_ignore_ascii_case("close");
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let size_line = self.line(deadline)?;
                let size =
                    usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                        .map_err(|_| Fail::Protocol(format!("bad chunk size {size_line:?}")))?;
                if size == 0 {
                    // Trailers, then the empty line.
                    while !self.line(deadline)?.is_empty() {}
                    break;
                }
                self.take_body(size, &mut body, deadline)?;
                if !self.line(deadline)?.is_empty() {
                    return Err(Fail::Protocol("chunk not followed by CRLF".into()));
                }
            }
        } else if let Some(n) = content_length {
            self.take_body(n, &mut body, deadline)?;
        } else if status >= 200 && status != 204 && status != 304 {
            return Err(Fail::Protocol("response without a length".into()));
        }
        Ok(Response {
            status,
            body,
            close,
        })
    }
}

#[derive(Default)]
pub(crate) struct LoadResult {
    pub(crate) wall: Duration,
    /// Requests written (answered or not).
    pub(crate) sent: usize,
    pub(crate) ok: usize,
    /// Latency of every request that got an answer or timed out, in µs.
    pub(crate) latencies_us: Vec<u64>,
    pub(crate) statuses: BTreeMap<u16, usize>,
    /// Body `"status"` words of 200 answers (accepted, duplicate, ...).
    pub(crate) words: BTreeMap<String, usize>,
    pub(crate) errors: usize,
    pub(crate) unanswered: usize,
    pub(crate) slow: usize,
    pub(crate) reconnects: usize,
    pub(crate) connect_failures: usize,
    pub(crate) samples: Vec<String>,
    pub(crate) aborted: bool,
    /// Per request: 0 not sent, 1 sent but not 200, 2 answered 200.
    pub(crate) fate: Vec<u8>,
    /// A load thread's (request, fate) pairs, merged into `fate`.
    pub(crate) sparse: Vec<(u32, u8)>,
}

impl LoadResult {
    pub(crate) fn rps(&self) -> f64 {
        self.ok as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    pub(crate) fn p(&self, pct: f64) -> f64 {
        percentile(&self.latencies_us, pct)
    }

    pub(crate) fn problems(&self) -> String {
        let mut out = Vec::new();
        let non200: usize = self
            .statuses
            .iter()
            .filter(|(s, _)| **s != 200)
            .map(|(_, n)| n)
            .sum();
        if non200 > 0 {
            out.push(format!("{non200} non-200 {:?}", self.statuses));
        }
        if self.unanswered > 0 {
            out.push(format!("{} unanswered >5 s", self.unanswered));
        }
        if self.slow > 0 {
            out.push(format!("{} answered after >1 s", self.slow));
        }
        if self.errors > 0 {
            out.push(format!("{} connection errors", self.errors));
        }
        if self.connect_failures > 0 {
            out.push(format!("{} failed connects", self.connect_failures));
        }
        let unsent = self.fate.iter().filter(|f| **f == 0).count();
        if unsent > 0 {
            out.push(format!("{unsent} never sent"));
        }
        if self.aborted {
            out.push(format!("ABORTED after {} s", WORKLOAD_LIMIT.as_secs()));
        }
        if out.is_empty() {
            "none".into()
        } else {
            out.join(", ")
        }
    }

    pub(crate) fn clean(&self) -> bool {
        self.problems() == "none"
    }
}

pub(crate) fn percentile(sorted: &[u64], pct: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((pct / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

/// Sends every request once over `conns` keep-alive connections. Each
/// thread takes the next request from a shared counter, so the copies of
/// an event (adjacent) are in flight on different connections at once.
pub(crate) fn run_load(addr: SocketAddr, requests: &[Vec<u8>], conns: usize) -> LoadResult {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(conns + 1);
    let n = requests.len();
    let (wall, parts) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..conns)
            .map(|_| {
                let (next, stop, barrier) = (&next, &stop, &barrier);
                scope.spawn(move || load_thread(addr, requests, next, stop, barrier))
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        // The cut-off: threads stop taking requests past the limit.
        let limit = start + WORKLOAD_LIMIT;
        while !handles.iter().all(|h| h.is_finished()) {
            if Instant::now() >= limit {
                stop.store(true, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let wall_end = Instant::now();
        let parts: Vec<LoadResult> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect();
        (wall_end.duration_since(start), parts)
    });
    let mut r = LoadResult {
        wall,
        fate: vec![0; n],
        aborted: stop.load(Ordering::Relaxed),
        ..LoadResult::default()
    };
    for p in parts {
        r.sent += p.sent;
        r.ok += p.ok;
        r.latencies_us.extend(p.latencies_us);
        for (s, c) in p.statuses {
            *r.statuses.entry(s).or_default() += c;
        }
        for (w, c) in p.words {
            *r.words.entry(w).or_default() += c;
        }
        r.errors += p.errors;
        r.unanswered += p.unanswered;
        r.slow += p.slow;
        r.reconnects += p.reconnects;
        r.connect_failures += p.connect_failures;
        for s in p.samples {
            if r.samples.len() < 8 {
                r.samples.push(s);
            }
        }
        for (i, f) in p.sparse {
            r.fate[i as usize] = f;
        }
    }
    r.latencies_us.sort_unstable();
    r
}

pub(crate) fn status_word(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.split_once(r#""status":""#)
        .and_then(|(_, rest)| rest.split_once('"'))
        .map_or("-".to_string(), |(w, _)| w.to_string())
}

pub(crate) fn load_thread(
    addr: SocketAddr,
    requests: &[Vec<u8>],
    next: &AtomicUsize,
    stop: &AtomicBool,
    barrier: &Barrier,
) -> LoadResult {
    let mut r = LoadResult::default();
    let mut conn = Conn::connect(addr).ok();
    if conn.is_none() {
        r.connect_failures += 1;
    }
    barrier.wait();
    let record_fate = |r: &mut LoadResult, i: usize, f: u8| r.sparse.push((i as u32, f));
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if conn.is_none() {
            // Reconnect, a few times, before taking a request.
            for attempt in 0..3 {
                match Conn::connect(addr) {
                    Ok(c) => {
                        conn = Some(c);
                        r.reconnects += 1;
                        break;
                    }
                    Err(_) => {
                        r.connect_failures += 1;
                        std::thread::sleep(Duration::from_millis(100 * (attempt + 1)));
                    }
                }
            }
            if conn.is_none() {
                break;
            }
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= requests.len() {
            break;
        }
        let Some(c) = conn.as_mut() else { break };
        let t = Instant::now();
        let result = c.exchange(&requests[i], t + ANSWER_TIMEOUT);
        let took = t.elapsed();
        r.sent += 1;
        match result {
            Ok(resp) => {
                r.latencies_us.push(took.as_micros() as u64);
                if took > SLOW {
                    r.slow += 1;
                }
                *r.statuses.entry(resp.status).or_default() += 1;
                if resp.status == 200 {
                    r.ok += 1;
                    *r.words.entry(status_word(&resp.body)).or_default() += 1;
                    record_fate(&mut r, i, 2);
                } else {
                    record_fate(&mut r, i, 1);
                    if r.samples.len() < 4 {
                        r.samples.push(format!(
                            "request {i}: {} {}",
                            resp.status,
                            String::from_utf8_lossy(&resp.body[..resp.body.len().min(200)])
                        ));
                    }
                }
                if resp.close {
                    conn = None;
                }
            }
            Err(fail) => {
                record_fate(&mut r, i, 1);
                if matches!(fail, Fail::Timeout) {
                    r.unanswered += 1;
                    r.latencies_us.push(took.as_micros() as u64);
                } else {
                    r.errors += 1;
                }
                if r.samples.len() < 4 {
                    r.samples.push(format!(
                        "request {i}: {fail} after {:.1} s",
                        took.as_secs_f64()
                    ));
                }
                // The connection's state is unknown: start a new one. The
                // request is not sent again (a provider would retry later).
                conn = None;
            }
        }
    }
    r
}
