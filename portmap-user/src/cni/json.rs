//! The shape of a JSON value whatever key holds it: what every part of the
//! configuration checks first (present, of the right type, an integer), with
//! the error naming the key as the user wrote it.

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::cni::error::code;
use crate::cni::json_keys::{self, Object};

/// A value that is missing, of the wrong type or not a number we can read.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    #[error("the network configuration on stdin is not valid JSON")]
    InvalidJson {
        #[source]
        source: serde_json::Error,
    },
    #[error("{field} is missing")]
    MissingField { field: String },
    #[error("{key} must not be empty")]
    EmptyField { key: String },
    #[error("{key}: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{key}: {value} is not an integer")]
    NotAnInteger { key: String, value: String },
}

impl ShapeError {
    /// The CNI spec error code for this error.
    pub fn cni_code(&self) -> u32 {
        match self {
            ShapeError::InvalidJson { .. } => code::DECODING_FAILURE,
            ShapeError::MissingField { .. }
            | ShapeError::EmptyField { .. }
            | ShapeError::WrongType { .. }
            | ShapeError::NotAnInteger { .. } => code::INVALID_NETWORK_CONFIG,
        }
    }
}

/// `parent.key` (or `key` at the root).
pub(crate) fn key_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

pub(crate) fn raw_to_value(raw: &RawValue) -> Result<Value, ShapeError> {
    // Only numbers beyond f64 fail here: the text was checked as JSON already.
    serde_json::from_str(raw.get()).map_err(|source| ShapeError::InvalidJson { source })
}

/// An object of the configuration, or the error naming `key` when the value
/// is something else.
pub(crate) fn object<'a>(key: &str, raw: &'a RawValue) -> Result<Object<'a>, ShapeError> {
    Object::parse(raw.get()).map_err(|_| ShapeError::WrongType {
        key: key.to_owned(),
        expected: "an object",
        found: json_keys::kind_of(raw),
    })
}

pub(crate) enum Integer {
    Unsigned(u64),
    /// Any negative integer: every caller rejects them, only the message differs.
    Negative,
}

/// A JSON integer. Floats (even 80.0) are refused: the CNI types are integers
/// and a fraction is a sign the value was computed wrongly.
pub(crate) fn integer(key: &str, value: &Value) -> Result<Integer, ShapeError> {
    let Value::Number(number) = value else {
        return Err(wrong_type(key, "an integer", value));
    };
    if let Some(unsigned) = number.as_u64() {
        Ok(Integer::Unsigned(unsigned))
    } else if number.is_i64() {
        Ok(Integer::Negative)
    } else {
        Err(ShapeError::NotAnInteger {
            key: key.to_owned(),
            value: number.to_string(),
        })
    }
}

pub(crate) fn expect_object<'a>(
    key: &str,
    value: &'a Value,
) -> Result<&'a Map<String, Value>, ShapeError> {
    value
        .as_object()
        .ok_or_else(|| wrong_type(key, "an object", value))
}

pub(crate) fn wrong_type(key: &str, expected: &'static str, found: &Value) -> ShapeError {
    ShapeError::WrongType {
        key: key.to_owned(),
        expected,
        found: json_kind(found),
    }
}

pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
