//! SQL actions' values bound as the types PostgreSQL inferred for their
//! parameters.

use std::error::Error as StdError;

use postgres::types::private::BytesMut;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use crate::store::tx::ParamValue;

/// A parameter value bound as the type PostgreSQL inferred for it, the
/// way SQLite's affinity would store it: integers into any integer, real
/// or numeric column; other numbers into real, or into numeric with every
/// digit; numbers, booleans and text into text; any value into json and jsonb (a string as a JSON
/// string); text that reads as the target type into it. What does not fit
/// is a statement error that names the type, so the action can cast.
#[derive(Debug)]
pub struct PgParam(pub ParamValue);

type BoxError = Box<dyn StdError + Sync + Send>;

impl ToSql for PgParam {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        use ParamValue as P;
        let v = &self.0;
        if *v == P::Null {
            return Ok(IsNull::Yes);
        }
        match *ty {
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                text_of(v).to_sql(&Type::TEXT, out)
            }
            Type::INT8 => int_of(v)?.to_sql(ty, out),
            Type::INT4 => i32::try_from(int_of(v)?)?.to_sql(ty, out),
            Type::INT2 => i16::try_from(int_of(v)?)?.to_sql(ty, out),
            Type::FLOAT8 => real_of(v)?.to_sql(ty, out),
            #[allow(clippy::cast_possible_truncation)]
            Type::FLOAT4 => (real_of(v)? as f32).to_sql(ty, out),
            Type::BOOL => match v {
                P::Bool(b) => b.to_sql(ty, out),
                P::Integer(0) => false.to_sql(ty, out),
                P::Integer(1) => true.to_sql(ty, out),
                P::Text(s) if s == "true" || s == "false" => (s == "true").to_sql(ty, out),
                _ => Err(mismatch(v, ty)),
            },
            Type::NUMERIC => {
                let text = match v {
                    P::Integer(_) | P::Number(_) | P::Text(_) | P::Document(_) => text_of(v),
                    _ => return Err(mismatch(v, ty)),
                };
                out.extend_from_slice(&numeric_binary(&text).ok_or_else(|| mismatch(v, ty))?);
                Ok(IsNull::No)
            }
            Type::JSON | Type::JSONB => {
                let json = match v {
                    P::Json(s) | P::Number(s) | P::Document(s) => s.clone(),
                    P::Text(s) => serde_json::Value::String(s.clone()).to_string(),
                    _ => text_of(v),
                };
                if *ty == Type::JSONB {
                    out.extend_from_slice(&[1]);
                }
                out.extend_from_slice(json.as_bytes());
                Ok(IsNull::No)
            }
            Type::BYTEA => text_of(v).as_bytes().to_sql(ty, out),
            _ => Err(mismatch(v, ty)),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

fn mismatch(v: &ParamValue, ty: &Type) -> BoxError {
    format!(
        "cannot bind {v:?} to a parameter of type {ty}: cast the parameter in the SQL (:name::text::{ty})"
    )
    .into()
}

fn text_of(v: &ParamValue) -> String {
    match v {
        ParamValue::Null => String::new(),
        ParamValue::Bool(b) => b.to_string(),
        ParamValue::Integer(i) => i.to_string(),
        ParamValue::Number(s)
        | ParamValue::Text(s)
        | ParamValue::Json(s)
        | ParamValue::Document(s) => s.clone(),
    }
}

fn int_of(v: &ParamValue) -> Result<i64, BoxError> {
    match v {
        ParamValue::Integer(i) => Ok(*i),
        ParamValue::Bool(b) => Ok(i64::from(*b)),
        ParamValue::Text(s) | ParamValue::Document(s) => {
            s.trim().parse().map_err(|_| mismatch(v, &Type::INT8))
        }
        _ => Err(mismatch(v, &Type::INT8)),
    }
}

#[allow(clippy::cast_precision_loss)]
fn real_of(v: &ParamValue) -> Result<f64, BoxError> {
    match v {
        ParamValue::Integer(i) => Ok(*i as f64),
        ParamValue::Number(s) | ParamValue::Text(s) | ParamValue::Document(s) => {
            s.trim().parse().map_err(|_| mismatch(v, &Type::FLOAT8))
        }
        _ => Err(mismatch(v, &Type::FLOAT8)),
    }
}

/// PostgreSQL's binary NUMERIC for a decimal number as JSON writes one
/// (`-12.5`, `1e30`, `12345678901234567890.25`): base-10000 digits, a
/// weight, a sign and the display scale. None when `text` is not such a
/// number.
pub(super) fn numeric_binary(text: &str) -> Option<Vec<u8>> {
    let t = text.trim();
    let (negative, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let (mantissa, exponent) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], t[i + 1..].parse::<i32>().ok()?),
        None => (t, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    if !int_part
        .bytes()
        .chain(frac_part.bytes())
        .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    // All the decimal digits, and where the point falls among them.
    let digits: Vec<u8> = int_part
        .bytes()
        .chain(frac_part.bytes())
        .map(|b| b - b'0')
        .collect();
    let point = i32::try_from(int_part.len()).ok()?.checked_add(exponent)?;
    let scale = (i32::try_from(digits.len()).ok()? - point).max(0);
    if !(-16_383..=16_383).contains(&point) || scale > 16_383 {
        return None;
    }
    // Pad so the point sits on a base-10000 boundary on both sides.
    let lead = (4 - point.rem_euclid(4)) % 4;
    let mut padded: Vec<u8> = std::iter::repeat_n(0, lead as usize).collect();
    padded.extend_from_slice(&digits);
    let int_len = point + lead;
    // Make sure the integer part is covered (point beyond the digits).
    while (padded.len() as i32) < int_len {
        padded.push(0);
    }
    while !padded.len().is_multiple_of(4) {
        padded.push(0);
    }
    let mut groups: Vec<i16> = padded
        .chunks(4)
        .map(|c| c.iter().fold(0i16, |acc, &d| acc * 10 + i16::from(d)))
        .collect();
    let mut weight = int_len / 4 - 1;
    // Strip leading and trailing zero groups.
    while groups.first() == Some(&0) {
        groups.remove(0);
        weight -= 1;
    }
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    let mut out = Vec::with_capacity(8 + groups.len() * 2);
    out.extend_from_slice(&i16::try_from(groups.len()).ok()?.to_be_bytes());
    out.extend_from_slice(&i16::try_from(weight).ok()?.to_be_bytes());
    let sign: u16 = if negative && !groups.is_empty() {
        0x4000
    } else {
        0
    };
    out.extend_from_slice(&sign.to_be_bytes());
    out.extend_from_slice(&u16::try_from(scale).ok()?.to_be_bytes());
    for g in groups {
        out.extend_from_slice(&g.to_be_bytes());
    }
    Some(out)
}

/// A shared statement's parameter (`store::tx::Arg`), bound as the type
/// PostgreSQL inferred for it: an integer into an integer column, text
/// into a text one, NULL into anything.
impl ToSql for crate::store::tx::Arg<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use crate::store::tx::Arg;
        match *self {
            Arg::Null => Ok(IsNull::Yes),
            Arg::Int(i) if *ty == Type::INT4 => i32::try_from(i)?.to_sql(ty, out),
            Arg::Int(i) => i.to_sql(ty, out),
            Arg::Text(s) => s.to_sql(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <i64 as ToSql>::accepts(ty) || <i32 as ToSql>::accepts(ty) || <&str as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}
