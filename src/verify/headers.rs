//! Reading request headers as the server hands them over: a list of
//! (name, value) pairs in arrival order, names in any case. Shared by the
//! verifiers, the key extractor, the receiver and the admin API (it is
//! `verify/`'s, the lowest layer that reads them). No IO; nothing else in
//! the crate is used.

/// Values of every header called `name` (compared ignoring ASCII case), in order.
pub fn header_values<'a>(
    headers: &'a [(String, String)],
    name: &str,
) -> impl Iterator<Item = &'a str> {
    headers
        .iter()
        .filter(move |(header, _)| header.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_ignores_case_and_keeps_order() {
        let headers: Vec<(String, String)> = [("X-A", "1"), ("x-b", "2"), ("x-a", "3")]
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(
            header_values(&headers, "x-A").collect::<Vec<_>>(),
            ["1", "3"]
        );
        assert_eq!(header_values(&headers, "x-c").count(), 0);
    }
}
